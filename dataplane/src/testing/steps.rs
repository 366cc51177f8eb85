//! Random test sequences that replay.

/// A tiny deterministic generator, so a failure replays; the random-sequence tests of both
/// modes' incremental syncs draw from it.
pub(crate) struct Steps(pub(crate) u64);

impl Steps {
    /// A number in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    /// A byte in `0..n`.
    pub(crate) fn byte_below(&mut self, n: u8) -> u8 {
        u8::try_from(self.below(u64::from(n))).unwrap_or(0)
    }
}
