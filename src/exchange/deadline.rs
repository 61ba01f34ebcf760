//! The deadline of one exchange call: its timeout, and the instant it runs out.

use std::time::{Duration, Instant};

/// The bound of a call's waits. The clock starts at the first wait that needs it, so a call whose
/// peers are already there never reads it. It keeps the call's timeout, for messages.
pub(super) struct Deadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl Deadline {
    pub(super) fn new(timeout: Duration) -> Deadline {
        Deadline { timeout, at: None }
    }

    /// The call's whole timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What is left of the timeout (zero once it has run out: a wait then checks once).
    pub(super) fn remaining(&mut self) -> Duration {
        let timeout = self.timeout;
        let at = *self.at.get_or_insert_with(|| Instant::now() + timeout);
        at.saturating_duration_since(Instant::now())
    }
}

#[cfg(test)]
mod tests;
