//! Why the eBPF mode's programs could not be put in place, or their maps written.

use aya::EbpfError;
use aya::maps::MapError;
use aya::programs::ProgramError;
use std::path::{Path, PathBuf};

/// Why the programs could not be put in place or their map written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The BPF filesystem is missing and could not be mounted.
    #[error("no BPF filesystem at {path} and none could be mounted there: {reason}")]
    BpfFs {
        /// The folder.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The agent lacks capabilities the mode needs.
    #[error(
        "the ebpf mode needs capabilities the agent lacks: {missing}; add them to its container \
         (deploy/ebpf does)"
    )]
    Capabilities {
        /// Each missing capability, with why it is needed.
        missing: String,
    },
    /// The cgroup to attach to is not part of a cgroup v2 hierarchy.
    #[error(
        "{path} is not a cgroup v2 hierarchy ({reason}): the ebpf mode attaches its programs to \
         one; set --cgroup-root"
    )]
    NotCgroup2 {
        /// The folder.
        path: PathBuf,
        /// What was found.
        reason: String,
    },
    /// The embedded object could not be loaded: its maps could not be created or opened.
    #[error("could not create or open the eBPF maps: {0}")]
    Maps(#[source] EbpfError),
    /// The kernel refused a program.
    #[error("the kernel refused the eBPF program {program}: {reason}")]
    Refused {
        /// The program.
        program: &'static str,
        /// The kernel's error and the verifier's last line.
        reason: String,
    },
    /// A program could not be loaded for a reason other than the kernel's refusal, attached
    /// or its link pinned.
    #[error("could not attach the eBPF program {program}")]
    Attach {
        /// The program.
        program: &'static str,
        /// What failed (aya's error names the system call, its source the kernel's answer).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file of the pins could not be read, written or removed.
    #[error("{path}: {source}")]
    Pins {
        /// The file or folder.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The services map refused a read or a write.
    #[error("the services map: {0}")]
    Map(#[source] MapError),
    /// The nftables table for traffic from outside (masquerade, refusals) could not be written
    /// or removed.
    #[error("the nftables table {0}")]
    Table(String),
    /// The node's addresses could not be listed.
    #[error("cannot list the node's addresses for its node ports: {0}")]
    NodeAddresses(#[source] std::io::Error),
    /// More entries than the services map holds.
    #[error(
        "the Services need {needed} entries of the services map, which holds {capacity}: their \
         last good entries stay"
    )]
    Full {
        /// Entries the state needs.
        needed: usize,
        /// Entries the map holds at most.
        capacity: usize,
    },
}

/// A program's load failure: the kernel's refusal, named, or another error.
pub(super) fn load_error(program: &'static str, err: ProgramError) -> Error {
    match err {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => Error::Refused {
            program,
            reason: refusal(&io_error, &verifier_log.to_string()),
        },
        other => Error::Attach {
            program,
            source: other.into(),
        },
    }
}

/// The kernel's reason for refusing a program: its error and the verifier's last line, which
/// names what the kernel lacks (a helper, a program type), rather than the whole log.
fn refusal(io_error: &std::io::Error, verifier_log: &str) -> String {
    match verifier_log
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
    {
        Some(last) => format!("{io_error}; the verifier said: {}", last.trim()),
        None => io_error.to_string(),
    }
}

pub(super) fn pins_error(path: &Path, source: std::io::Error) -> Error {
    Error::Pins {
        path: path.to_owned(),
        source,
    }
}

/// Whether a map's refusal says only that the key is not there (aya reports a deletion's
/// `ENOENT` as the system call's error, a lookup's as `KeyNotFound`).
pub(super) fn is_missing(err: &MapError) -> bool {
    match err {
        MapError::KeyNotFound => true,
        MapError::SyscallError(aya::sys::SyscallError { io_error, .. }) => {
            io_error.kind() == std::io::ErrorKind::NotFound
        }
        _ => false,
    }
}
