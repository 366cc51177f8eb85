//! The order the client tries the controllers in, and how long it waits between tries.

use std::time::Duration;

/// One pass over the controllers known, in order, and the controller that last asked this agent
/// to go elsewhere for now (protocol rules 10 and 13).
#[derive(Debug, Default)]
pub(super) struct Rotation {
    pass: Vec<String>,
    next: usize,
    sent_away: Option<String>,
}

impl Rotation {
    /// Whether every controller of the pass has been tried: time to list them again.
    pub(super) fn pass_done(&self) -> bool {
        self.next >= self.pass.len()
    }

    /// The controllers of the pass that ended, to fall back on when they cannot be listed.
    pub(super) fn take_pass(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pass)
    }

    /// Starts a pass over `controllers`. The one that last sent this agent away goes last, so a
    /// replica shedding agents does not take them straight back.
    pub(super) fn start_pass(&mut self, mut controllers: Vec<String>) {
        if let Some(away) = self.sent_away.take()
            && let Some(at) = controllers.iter().position(|c| *c == away)
        {
            let moved = controllers.remove(at);
            controllers.push(moved);
        }
        self.pass = controllers;
        self.next = 0;
    }

    /// The controller to try now; `None` when the pass is empty.
    pub(super) fn next_controller(&mut self) -> Option<String> {
        let controller = self.pass.get(self.next).cloned();
        if controller.is_some() {
            self.next += 1;
        }
        controller
    }

    /// Notes how the stream to `controller` ended: whether it asked the agent to wait before
    /// coming back (`asked_to_wait`), and whether the agent should come straight back to it
    /// (`come_back`): a working stream ended for a rotated credential, where the replica still
    /// knows what this node acknowledged (protocol rule 7).
    pub(super) fn ended(&mut self, controller: &str, asked_to_wait: bool, come_back: bool) {
        if asked_to_wait {
            self.sent_away = Some(controller.to_owned());
        }
        if come_back {
            self.next = self.next.saturating_sub(1);
        }
    }

    /// How long to wait before the next try, before jitter: the wait a controller `asked` for
    /// applies only before that controller again, so another one left in this pass is tried at
    /// once (a replica shedding agents or still reading the cluster does not mean the others
    /// are); otherwise `backoff`.
    pub(super) fn delay(&self, asked: Option<Duration>, backoff: Duration) -> Duration {
        match asked {
            Some(_) if !self.pass_done() => Duration::ZERO,
            Some(asked) => asked,
            None => backoff,
        }
    }
}

#[cfg(test)]
mod tests;
