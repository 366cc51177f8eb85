//! What the executors share about the kernel's command-line tools they drive (iptables,
//! conntrack, nft, ip, ipset).

use std::{
    io,
    process::{Output, Stdio},
};
use tokio::{io::AsyncWriteExt, process::Command};

/// A tool could not be started or waited for (missing binary, no permission...).
#[derive(Debug, thiserror::Error)]
#[error("could not run {program}")]
pub struct RunError {
    /// The program that was spawned (the first word of the command line).
    pub program: String,
    /// Why it could not run.
    #[source]
    pub source: io::Error,
}

/// A tool's run: its output, and whether all of its input was written to it.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status, stdout and stderr.
    pub output: Output,
    /// Writing its standard input: a tool that failed may stop reading early, so an error here
    /// matters only when it exited 0.
    pub written: io::Result<()>,
}

/// Runs `program` with `args` (no shell), feeding it the parts of `stdin` one after the other
/// if given, and collects its output. The process is killed if the future is dropped.
///
/// # Errors
///
/// [`RunError`] when it cannot be started or waited for.
pub async fn run(program: &str, args: &[String], stdin: Option<&[&str]>) -> Result<Ran, RunError> {
    let run_error = |source| RunError {
        program: program.to_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(run_error)?;
    let pipe = child.stdin.take();
    let write = async move {
        if let (Some(mut pipe), Some(parts)) = (pipe, stdin) {
            for part in parts {
                pipe.write_all(part.as_bytes()).await?;
            }
            // Dropping the pipe closes it, so the tool sees end of input.
        }
        Ok::<_, io::Error>(())
    };
    let (written, output) = tokio::join!(write, child.wait_with_output());
    Ok(Ran {
        output: output.map_err(run_error)?,
        written,
    })
}

/// A tool's stderr as one trimmed line of text for an error message.
#[must_use]
pub fn stderr_text(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr).trim().to_owned()
}
