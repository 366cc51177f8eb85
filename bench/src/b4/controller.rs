//! B4's controller: the real `splitproxy-controller` binary in its own process, serving the
//! manifests directory, pinned to one CPU when `taskset` is there, so its CPU and memory are its
//! own and the load generator cannot steal its core.

use crate::process::{self, Memory};
use anyhow::Context as _;
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

/// How to start a controller, again and again on the same port.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The controller binary (next to this one).
    pub binary: PathBuf,
    /// The manifests directory it serves.
    pub manifests: PathBuf,
    /// The node view port agents connect to.
    pub listen: SocketAddr,
    /// The CPU it runs on; `None` leaves it unpinned.
    pub cpu: Option<usize>,
    /// Where its log goes (appended to, across restarts).
    pub log: PathBuf,
    /// The controllers' Service (`NAMESPACE/NAME`) it counts replicas in, if any.
    pub controller_service: Option<String>,
}

/// A running controller process; killed when dropped.
#[derive(Debug)]
pub struct Controller {
    child: Child,
}

impl Launch {
    /// Starts one controller process.
    ///
    /// # Errors
    ///
    /// Fails when the log cannot be opened or the process cannot be spawned.
    pub fn start(&self) -> anyhow::Result<Controller> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut command = match self.cpu {
            Some(cpu) => {
                let mut taskset = Command::new("taskset");
                taskset
                    .args(["--cpu-list", &cpu.to_string()])
                    .arg(&self.binary);
                taskset
            }
            None => Command::new(&self.binary),
        };
        command
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--listen")
            .arg(self.listen.to_string())
            .args([
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--inspection-bind-address",
                "127.0.0.1:0",
            ])
            .args(
                self.controller_service
                    .iter()
                    .flat_map(|service| ["--controller-service", service]),
            )
            // Warnings only, unless the run's own RUST_LOG asks for more.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        Ok(Controller { child })
    }
}

impl Controller {
    /// The process id (taskset execs the controller, so it keeps this one).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU time so far; zero once it is gone.
    #[must_use]
    pub fn cpu_time(&self) -> Duration {
        process::cpu_time_of(self.pid()).unwrap_or_default()
    }

    /// Its memory now and at its peak; `None` once it is gone.
    #[must_use]
    pub fn memory(&self) -> Option<Memory> {
        Memory::of(self.pid())
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILLs it and reaps it: a crash, nothing flushed or said goodbye to.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The controller binary built next to the running bench binary.
///
/// # Errors
///
/// Fails when this binary's path is unknown or the controller is not built.
pub fn binary() -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()
        .context("finding this binary")?
        .with_file_name("splitproxy-controller");
    anyhow::ensure!(
        path.is_file(),
        "{} is not built (cargo build --release --workspace --bins)",
        path.display()
    );
    Ok(path)
}

/// Whether `taskset` can pin a process here.
#[must_use]
pub fn can_pin() -> bool {
    Path::new("/usr/bin/taskset").is_file() || Path::new("/bin/taskset").is_file()
}
