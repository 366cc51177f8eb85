//! A bounded load generator in the lab: `sp-testpod load` sends requests to several Services at a
//! fixed rate each, one new connection per request, and writes one [`Outcome`] per request to a
//! file; this module starts it in a client namespace and tallies what it wrote, per time window
//! and per Service.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::lab::{HasNamespace, Lab, Process};
use crate::workspace_binary;

/// One request the load generator made: one JSON line of its output file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// When the request started, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The name of the target (the Service, and how it was reached).
    pub target: String,
    /// Whether a `200` answer arrived within the timeout.
    pub ok: bool,
    /// The answering pod's name, or the error.
    pub answer: String,
}

/// A running `sp-testpod load` and the file it writes.
pub struct Load {
    process: Process,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Load {
    /// Starts `sp-testpod load` in `ns`: `rate` requests per second to each of `targets` (name,
    /// `http://IP:PORT/` URL), each given `timeout`, for at most `max_duration`.
    ///
    /// # Errors
    ///
    /// If `sp-testpod` is missing or cannot be started, or the output file cannot be made.
    pub fn start(
        lab: &mut Lab,
        ns: &(impl HasNamespace + ?Sized),
        targets: &[(&str, String)],
        rate: u32,
        timeout: Duration,
        max_duration: Duration,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("splitproxy-load-")
            .tempdir()
            .context("creating the load generator's directory")?;
        let out = dir.path().join("outcomes.jsonl");
        let (rate, timeout_ms, duration_s) = (
            rate.to_string(),
            timeout.as_millis().to_string(),
            max_duration.as_secs().to_string(),
        );
        let target_args: Vec<String> = targets
            .iter()
            .map(|(name, url)| format!("{name}={url}"))
            .collect();
        let out_arg = out.to_string_lossy().into_owned();
        let mut args = vec![
            "load",
            "--rate",
            &rate,
            "--timeout-ms",
            &timeout_ms,
            "--duration-s",
            &duration_s,
            "--out",
            &out_arg,
        ];
        for target in &target_args {
            args.extend(["--target", target.as_str()]);
        }
        let process = lab.spawn(ns, workspace_binary("sp-testpod")?, &args)?;
        Ok(Self {
            process,
            out,
            _dir: dir,
        })
    }

    /// The requests finished so far.
    ///
    /// # Errors
    ///
    /// If the file cannot be read or a complete line does not parse.
    pub fn outcomes(&self) -> Result<Vec<Outcome>> {
        let text = std::fs::read_to_string(&self.out)
            .with_context(|| format!("reading {}", self.out.display()))?;
        // A line without its newline is still being written (or was cut by the kill).
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .map(|line| {
                serde_json::from_str(line).with_context(|| format!("bad outcome line {line:?}"))
            })
            .collect()
    }

    /// Stops the generator (requests in flight are not counted) and returns every outcome.
    ///
    /// # Errors
    ///
    /// If it cannot be killed or its file read.
    pub fn stop(self, lab: &mut Lab) -> Result<Vec<Outcome>> {
        lab.kill(&self.process)?;
        self.outcomes()
    }

    /// The generator's log (errors it printed), for failure messages.
    #[must_use]
    pub fn log_tail(&self) -> String {
        self.process.log_tail(20)
    }
}

/// What one target saw in a window: requests sent, failed, and who answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests started in the window.
    pub sent: u32,
    /// Of those, the ones that got no `200` in time.
    pub failed: u32,
    /// Answers per pod.
    pub answers: BTreeMap<String, u32>,
    /// The first few distinct errors.
    pub errors: Vec<String>,
}

/// How many distinct errors a tally keeps.
const MAX_ERRORS: usize = 3;

/// Tallies per target the outcomes whose start lies in `[from, to)`.
#[must_use]
pub fn tally(outcomes: &[Outcome], from: SystemTime, to: SystemTime) -> BTreeMap<String, Tally> {
    let (from, to) = (unix_ms(from), unix_ms(to));
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| (from..to).contains(&o.at_ms)) {
        let tally = tallies.entry(outcome.target.clone()).or_default();
        tally.sent += 1;
        if outcome.ok {
            *tally.answers.entry(outcome.answer.clone()).or_default() += 1;
        } else {
            tally.failed += 1;
            if tally.errors.len() < MAX_ERRORS && !tally.errors.contains(&outcome.answer) {
                tally.errors.push(outcome.answer.clone());
            }
        }
    }
    tallies
}

/// Milliseconds since the Unix epoch, as [`Outcome::at_ms`] counts them.
#[must_use]
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn outcome(at_ms: u64, target: &str, ok: bool, answer: &str) -> Outcome {
        Outcome {
            at_ms,
            target: target.into(),
            ok,
            answer: answer.into(),
        }
    }

    #[test]
    fn a_tally_counts_only_its_window_per_target() {
        let outcomes = [
            outcome(999, "a", false, "connect refused"),
            outcome(1000, "a", true, "pod-1"),
            outcome(1500, "a", false, "timed out"),
            outcome(1600, "b", true, "pod-2"),
            outcome(2000, "a", true, "pod-1"),
        ];
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        let tallies = tally(&outcomes, at(1000), at(2000));
        assert_eq!(tallies["a"].sent, 2);
        assert_eq!(tallies["a"].failed, 1);
        assert_eq!(tallies["a"].errors, ["timed out"]);
        assert_eq!(tallies["a"].answers["pod-1"], 1);
        assert_eq!(tallies["b"].answers["pod-2"], 1);
        assert_eq!(tallies.len(), 2);
    }
}
