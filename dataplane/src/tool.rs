//! What the executors share about the kernel's command-line tools they drive (iptables,
//! conntrack, nft, ip, ipset).

use std::io;

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
