//! SIGINT/SIGTERM delivered through a self-pipe, so the main thread can wait for them with
//! `poll` (together with a timeout) instead of doing work inside a signal handler.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// Write end of the pipe, read by the handler; -1 when no [`Signals`] is installed.
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let byte = signal as u8;
    // SAFETY: errno is thread-local; it is saved and restored so the interrupted code does not
    // see the handler's write(2) result. write(2) is async-signal-safe and `byte` outlives it.
    unsafe {
        let saved = *libc::__errno_location();
        libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = saved;
    }
}

/// Receives the signals it was installed for until it is dropped. One per process.
pub struct Signals {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Signals {
    pub fn install(signals: &[libc::c_int]) -> io::Result<Signals> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2(2) writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        WRITE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        for &signal in signals {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
            // is an `extern "C" fn(c_int)` that only does async-signal-safe work.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(Signals {
            read,
            _write: write,
        })
    }

    /// Waits up to `timeout` (forever with `None`) for a signal; returns its number.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Option<libc::c_int>> {
        if let Some(signal) = self.take()? {
            return Ok(Some(signal));
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
        let mut pfd = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        self.take()
    }

    /// A signal that already arrived, without waiting.
    fn take(&self) -> io::Result<Option<libc::c_int>> {
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into `byte`, which is valid for writes.
        let n = unsafe { libc::read(self.read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            return Ok(Some(libc::c_int::from(byte)));
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ if n == 0 => Ok(None),
            _ => Err(err),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        WRITE_FD.store(-1, Ordering::SeqCst);
    }
}
