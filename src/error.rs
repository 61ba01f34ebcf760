//! One error type for the whole library. Every error carries a [`Status`] (what the C ABI returns)
//! and a message that says what failed, for whom (rank, peer, key) and what to do about it.

use std::ffi::CStr;
use std::fmt;

/// Status codes returned by every exported C function. `Ok` is zero; everything else is an error
/// whose details are in the thread-local last-error message.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// An argument was NULL, out of range or otherwise unusable.
    InvalidArgument = 1,
    /// A bounded wait (store get/wait, barrier, exchange) ran out of time.
    Timeout = 2,
    /// A socket or file operation failed (connection refused/reset, server gone).
    Io = 3,
    /// The peer sent bytes that do not follow the protocol, or a record failed validation.
    Protocol = 4,
    /// A key, handle or cache entry that was asked for does not exist.
    NotFound = 5,
    /// A CUDA driver call failed.
    Cuda = 6,
    /// No CUDA driver could be loaded on this machine.
    CudaUnavailable = 7,
    /// The operation is valid but not supported here (e.g. VMM memory through legacy IPC).
    Unsupported = 8,
    /// The object is in the wrong state for this call (already freed, already running, closed).
    InvalidState = 9,
    /// A Rust panic was caught at the C boundary; the object it touched may be unusable.
    Panic = 10,
    /// A bug in this library: please report it with the message.
    Internal = 11,
}

/// A short, stable, lower-case name for each status, in code order (`nvfipc_status_name` hands
/// them to C as they are).
pub(crate) const STATUS_NAMES: [&CStr; 12] = [
    c"ok",
    c"invalid argument",
    c"timeout",
    c"i/o error",
    c"protocol error",
    c"not found",
    c"CUDA error",
    c"CUDA driver not available",
    c"unsupported",
    c"invalid state",
    c"panic",
    c"internal error",
];

impl Status {
    /// A short, stable, lower-case name for the status.
    pub fn name(self) -> &'static str {
        STATUS_NAMES[self as usize].to_str().unwrap_or_default()
    }
}

/// An error: a status plus a human-readable message with the context needed to act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, message)
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(Status::Timeout, message)
    }
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(Status::Io, message)
    }
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(Status::Protocol, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Status::NotFound, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Status::Unsupported, message)
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidState, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Status::Internal, message)
    }

    /// Wraps an OS error with what we were doing when it happened.
    pub fn from_io(context: impl fmt::Display, err: &std::io::Error) -> Self {
        let status = match err.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Status::Timeout,
            _ => Status::Io,
        };
        Self::new(status, format!("{context}: {err}"))
    }

    /// Prepends context ("rank 3: ") to the message, keeping the status.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.status.name())
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests;
