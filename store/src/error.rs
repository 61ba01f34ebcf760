//! The store's error: a [`Status`] (what kind of failure) and a message that says what failed,
//! at which store address, for which operation and keys, and what to do about it.

use std::fmt;

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// A request over the protocol's limits (refused before anything was sent), or an unusable
    /// argument.
    InvalidArgument,
    /// A wait, a reply or the connection ran out of time.
    Timeout,
    /// A socket operation failed (connection refused or reset, server gone).
    Io,
    /// The peer sent bytes that do not follow the protocol (or is not a TCPStore at all).
    Protocol,
    /// The object is in the wrong state: a connection broken by an earlier error, a server that
    /// has stopped.
    InvalidState,
}

impl Status {
    /// A short, stable, lower-case name for the status.
    pub fn name(self) -> &'static str {
        match self {
            Status::InvalidArgument => "invalid argument",
            Status::Timeout => "timeout",
            Status::Io => "i/o error",
            Status::Protocol => "protocol error",
            Status::InvalidState => "invalid state",
        }
    }
}

/// An error of the store: a status plus a human-readable message.
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
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(Status::Protocol, message)
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidState, message)
    }

    /// Wraps an OS error with what was being done when it happened.
    pub fn from_io(context: impl fmt::Display, err: &std::io::Error) -> Self {
        let status = match err.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Status::Timeout,
            _ => Status::Io,
        };
        Self::new(status, format!("{context}: {err}"))
    }

    /// Prepends context ("store host:port: ") to the message, keeping the status.
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
