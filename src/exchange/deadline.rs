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
mod tests {
    use super::*;

    #[test]
    fn the_deadline_starts_at_its_first_use_and_then_holds() {
        let mut d = Deadline::new(Duration::from_secs(60));
        assert!(d.at.is_none());
        let first = d.remaining();
        assert!(first > Duration::from_secs(59) && first <= Duration::from_secs(60));
        let at = d.at.expect("set by the first use");
        std::thread::sleep(Duration::from_millis(2));
        assert!(d.remaining() < first);
        assert_eq!(d.at, Some(at));
        assert_eq!(d.timeout(), Duration::from_secs(60));
        assert_eq!(Deadline::new(Duration::ZERO).remaining(), Duration::ZERO);
    }
}
