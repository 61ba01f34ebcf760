//! Bounds on the memory a server holds beyond the stored data (docs/PROTOCOL.md §1): the reply
//! budget (what replies hold) and the pending budget (what requests not yet answered hold: WAIT
//! registrations and partly read requests), each a [`Budget`] that [`Charge`]s draw from.

use super::state::Refusal;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of one kind that all connections of a server hold together, up to a limit.
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// Bytes released since the last [`Budget::take_freed`] (to trim the heap after).
    freed: AtomicUsize,
    /// How many times budget was given back (parked connections then try again).
    releases: AtomicU64,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
            freed: AtomicUsize::new(0),
            releases: AtomicU64::new(0),
        })
    }

    /// Takes `bytes` if they fit under the limit, or if nothing else is held (so a request
    /// larger than the whole budget is served alone rather than never).
    fn grab(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used == 0 || used.saturating_add(bytes) <= self.limit).then(|| used + bytes)
            })
            .is_ok()
    }

    /// `bytes` of the budget if [`Budget::grab`] gets them.
    pub fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        self.grab(bytes).then(|| Charge {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// An empty charge that [`Charge::set`] grows whatever the budget holds (memory that is
    /// already there, such as unsent output).
    pub fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    pub fn spent(&self) -> bool {
        self.used.load(Ordering::Acquire) >= self.limit
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn freed(&self) -> usize {
        self.freed.load(Ordering::Acquire)
    }

    pub fn take_freed(&self) -> usize {
        self.freed.swap(0, Ordering::AcqRel)
    }

    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Acquire)
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.freed.fetch_add(bytes, Ordering::AcqRel);
            self.releases.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Bytes held of a [`Budget`], given back when dropped.
pub(crate) struct Charge {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Charge {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` from now on, whatever the budget holds.
    pub fn set(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget
                .used
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// The pending budget of a server and the most of it one client may hold.
#[derive(Clone)]
pub(crate) struct PendingLimits {
    pub budget: Arc<Budget>,
    pub per_client: usize,
}

impl Default for PendingLimits {
    /// No bounds (the store logic's own tests).
    fn default() -> Self {
        PendingLimits {
            budget: Budget::new(usize::MAX),
            per_client: usize::MAX,
        }
    }
}

impl PendingLimits {
    /// Grows a client's `charge` by `more` bytes for `what` (a request, in words), or refuses it
    /// naming the limit it would break.
    pub fn grow(
        &self,
        charge: &mut Charge,
        more: usize,
        what: impl FnOnce() -> String,
    ) -> Result<(), Refusal> {
        let wanted = charge.bytes.saturating_add(more);
        let (bytes, limit, all_clients) = if wanted > self.per_client {
            (wanted, self.per_client, false)
        } else if !self.budget.grab(more) {
            let used = self.budget.used();
            (used.saturating_add(more), self.budget.limit, true)
        } else {
            charge.bytes = wanted;
            return Ok(());
        };
        let what = what();
        Err(Refusal::Pending {
            what,
            bytes,
            limit,
            all_clients,
        })
    }

    /// Refuses a request that its length fields so far say is at least `needed` bytes long,
    /// more than one client may hold (before its bytes are read).
    pub fn frame(&self, command: &str, needed: usize) -> Result<(), Refusal> {
        if needed <= self.per_client {
            return Ok(());
        }
        Err(Refusal::Pending {
            what: format!("a {command} request of at least {needed} bytes"),
            bytes: needed,
            limit: self.per_client,
            all_clients: false,
        })
    }
}
