//! SIGINT/SIGTERM for the main thread to wait for, together with a timeout, instead of doing work
//! inside a signal handler. signal-hook runs the async-signal-safe part: each signal records its
//! number and wakes a socket pair the main thread reads with a timeout.

use signal_hook::low_level::{pipe, unregister};
use signal_hook::SigId;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Receives the signals it was installed for until it is dropped. One per process.
pub struct Signals {
    /// The number of the last signal not yet taken; 0 for none.
    last: Arc<AtomicUsize>,
    /// Read end of the socket pair every signal writes a byte to.
    wake: UnixStream,
    ids: Vec<SigId>,
}

impl Signals {
    pub fn install(signals: &[libc::c_int]) -> io::Result<Signals> {
        let (wake, write) = UnixStream::pair()?;
        let last = Arc::new(AtomicUsize::new(0));
        let mut installed = Signals {
            last,
            wake,
            ids: Vec::new(),
        };
        for &signal in signals {
            // Actions run in the order they were registered: the number is there before the
            // reader wakes.
            let number = signal as usize;
            let id =
                signal_hook::flag::register_usize(signal, Arc::clone(&installed.last), number)?;
            installed.ids.push(id);
            installed
                .ids
                .push(pipe::register(signal, write.try_clone()?)?);
        }
        Ok(installed)
    }

    /// Waits up to `timeout` (forever with `None`) for a signal; returns its number.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Option<libc::c_int>> {
        if let Some(signal) = self.take() {
            return Ok(Some(signal));
        }
        // A zero read timeout would mean "forever".
        let timeout = timeout.map(|t| t.max(Duration::from_millis(1)));
        self.wake.set_read_timeout(timeout)?;
        let mut bytes = [0u8; 64];
        match (&self.wake).read(&mut bytes) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
        Ok(self.take())
    }

    /// A signal that already arrived, without waiting.
    pub fn take(&self) -> Option<libc::c_int> {
        match self.last.swap(0, Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as libc::c_int),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // signal-hook keeps its handler (it does not restore the default action): a signal that
        // arrives after this is ignored.
        for id in self.ids.drain(..) {
            unregister(id);
        }
    }
}

#[cfg(test)]
mod tests;
