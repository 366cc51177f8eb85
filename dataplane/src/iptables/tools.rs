//! The iptables tools of one IP family, run as processes without a shell: `iptables-save` to
//! read a table, one `iptables-restore --noflush` per transaction (a full sync's with the jumps
//! from the built-in chains, [`Hooks`]), and `iptables` for the canary probes. The iptables mode and the IPVS mode's masquerade
//! and filter rules both write through it.

use super::hooks::{Hooks, Jump};
use super::{CANARY_TABLES, Config, Error, KUBE_PROXY_CANARY, Result};
use crate::full_sync::FullSyncClock;
use crate::tool::{self, stderr_text};
use std::time::Instant;

/// Runs one family's iptables tools as [`Config`] says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tools {
    config: Config,
    /// When every canary chain was last known to be there: probed, or written by a full sync.
    canaries_seen: Option<Instant>,
}

impl Tools {
    /// Tools run as `config` says.
    pub(crate) fn new(config: Config) -> Self {
        Self {
            config,
            canaries_seen: None,
        }
    }

    /// The configuration in use, to change.
    pub(crate) fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// The configuration in use.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// `iptables-save` of `table`.
    pub(crate) async fn saved(&self, table: &str) -> Result<String> {
        let args = ["-t".to_owned(), table.to_owned()];
        let output = self.run(&self.config.iptables_save, &args, None).await?;
        if !output.status.success() {
            return Err(Error::Save {
                status: output.status,
                stderr: stderr_text(&output.stderr),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Applies `payload`, the tables one after the other, in one `iptables-restore --noflush`
    /// transaction; `partial` says whether it holds only the changed Services' chains, for the
    /// error.
    pub(crate) async fn restore(&self, payload: &[&str], partial: bool) -> Result<()> {
        let args = [
            "-w".to_owned(),
            self.config.lock_wait_seconds.to_string(),
            "--noflush".to_owned(),
        ];
        let output = self
            .run(&self.config.iptables_restore, &args, Some(payload))
            .await?;
        if !output.status.success() {
            return Err(Error::Restore {
                status: output.status,
                stderr: stderr_text(&output.stderr),
                partial,
            });
        }
        Ok(())
    }

    /// `iptables-save` of the tables a full sync reads: nat, whose chains it deletes when no
    /// longer rendered, and filter, which with nat holds the jumps from the built-in chains.
    pub(crate) async fn saved_for_full_sync(&self) -> Result<String> {
        Ok(format!(
            "{}{}",
            self.saved("nat").await?,
            self.saved("filter").await?
        ))
    }

    /// A full sync's transaction: `sections` restored with the canaries, and the chains and
    /// jumps missing from `saved` (see [`Hooks::missing_from`]).
    pub(crate) async fn restore_full<'j>(
        &self,
        sections: &[&str],
        saved: &str,
        chains: &[(&str, &str)],
        jumps: impl IntoIterator<Item = &'j Jump>,
    ) -> Result<()> {
        let hooks = Hooks::missing_from(saved, chains, jumps);
        self.restore(&hooks.restore_input(sections), false).await?;
        for jump in hooks.inserted() {
            tracing::info!(
                ip_family = self.config.family.name(),
                table = jump.table,
                chain = jump.chain,
                target = jump.target,
                "installed jump"
            );
        }
        Ok(())
    }

    /// Runs `binary args...` (no shell), feeding it the parts of `stdin` one after the other if
    /// given, and collects its output.
    async fn run(
        &self,
        binary: &str,
        args: &[String],
        stdin: Option<&[&str]>,
    ) -> Result<std::process::Output> {
        let (program, args) = self.config.command_line(binary, args);
        let ran = tool::run(&program, &args, stdin).await?;
        // A tool that failed may stop reading early: its status and stderr say more than EPIPE.
        if ran.output.status.success() {
            ran.written.map_err(Error::WriteInput)?;
        }
        Ok(ran.output)
    }

    /// Whether every table's canary chain is still there. They are probed once per
    /// [`Config::canary_interval`], as kube-proxy's monitor does once per sync period, not before
    /// every sync: a probe is three processes per family. In between they count as present;
    /// partial syncs do not write them, so a flush stays visible until the next probe. Any
    /// failure to tell (a missing table, or worse) counts as gone, since a full sync is always
    /// safe.
    /// Why this sync must be full, or `None` when a partial one is enough: the [`FullSyncClock`]'s
    /// reasons first, then a canary chain gone (probed when due).
    pub(crate) async fn full_sync_reason(
        &mut self,
        clock: &FullSyncClock,
        in_kernel: bool,
    ) -> Result<Option<&'static str>> {
        if let Some(reason) = clock.reason(in_kernel) {
            return Ok(Some(reason));
        }
        if !self.canaries_present().await? {
            return Ok(Some("canary chain gone"));
        }
        Ok(None)
    }

    pub(crate) async fn canaries_present(&mut self) -> Result<bool> {
        if self
            .canaries_seen
            .is_some_and(|at| at.elapsed() < self.config.canary_interval)
        {
            return Ok(true);
        }
        for table in CANARY_TABLES {
            let args = [
                "-w".to_owned(),
                self.config.lock_wait_seconds.to_string(),
                "-t".to_owned(),
                table.to_owned(),
                "-S".to_owned(),
                KUBE_PROXY_CANARY.to_owned(),
            ];
            if !self
                .run(&self.config.iptables, &args, None)
                .await?
                .status
                .success()
            {
                tracing::warn!(
                    ip_family = self.config.family.name(),
                    table,
                    "canary chain is gone, the rules were flushed; syncing all of them"
                );
                return Ok(false);
            }
        }
        self.canaries_seen = Some(Instant::now());
        Ok(true)
    }

    /// Notes that a full sync has just written the canary chains.
    pub(crate) fn canaries_written(&mut self) {
        self.canaries_seen = Some(Instant::now());
    }
}
