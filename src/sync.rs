//! Small synchronisation helpers shared by the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
///
/// For structures that every holder leaves consistent between statements (each update is one
/// insert, remove or push), so a thread that panicked while holding the lock left nothing half
/// done; callers say why that holds where they use it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
