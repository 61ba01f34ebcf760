//! The importer's side: one request over one socket route, and the `pidfd_getfd` rung. Every
//! step is bounded by the caller's deadline; each failure becomes the [`Gate`] that closed the
//! rung.

use super::diagnose::{pidfd_gate_of, Gate};
use super::frame::{ErrorCode, FetchRequest, Parsed, Reply, HEADER_LEN, MAX_BODY};
use super::peer::Route;
use super::registry::FdId;
use crate::os::fd_passing as sys;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

/// Pause between connection attempts to a socket that is not (yet) there.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

fn connect_gate(route: &Route, e: &io::Error) -> Gate {
    match (route, e.kind()) {
        (Route::Path(_), io::ErrorKind::NotFound) => Gate::PathAbsent,
        (Route::Path(_), io::ErrorKind::PermissionDenied) => Gate::PathDenied(e.to_string()),
        _ => Gate::Unreachable(e.to_string()),
    }
}

/// Connects to `route`, retrying until `retry_until` (a responder that is not listening yet, or
/// whose backlog is full); non-blocking, so no attempt outlasts the deadline.
fn connect(route: &Route, retry_until: Instant) -> Result<UnixStream, Gate> {
    let addr = match route {
        Route::Abstract(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        Route::Path(p) => SocketAddr::from_pathname(p),
    }
    .map_err(|e| Gate::Other(format!("not a socket address: {e}")))?;
    loop {
        match mio::net::UnixStream::connect_addr(&addr) {
            Ok(s) => {
                let s = UnixStream::from(s);
                s.set_nonblocking(false)
                    .map_err(|e| Gate::Other(e.to_string()))?;
                return Ok(s);
            }
            Err(e) => {
                if Instant::now() + RETRY_PAUSE >= retry_until {
                    return Err(connect_gate(route, &e));
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
}

fn timed_out(what: &str, e: &io::Error) -> Gate {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Gate::TimedOut(format!("no reply to the request while {what}"))
        }
        _ => Gate::Broken(format!("{what}: {e}")),
    }
}

/// Asks the responder at `route` for `ids` (pipelined on one new connection) and returns their
/// descriptors in order, with the connection when it can serve further requests; the first
/// failure ends it with its gate.
pub fn fetch_over_socket(
    route: &Route,
    request: FetchRequest,
    ids: &[FdId],
    deadline: Instant,
    retry_until: Instant,
) -> Result<(Vec<OwnedFd>, Option<UnixStream>), Gate> {
    let stream = connect(route, retry_until.min(deadline))?;
    fetch_on(stream, request, ids, deadline)
}

/// [`fetch_over_socket`] on a connection made before. The connection comes back only when it is
/// in step (every reply read, nothing left over), so a later request cannot read a stale reply.
pub fn fetch_on(
    stream: UnixStream,
    request: FetchRequest,
    ids: &[FdId],
    deadline: Instant,
) -> Result<(Vec<OwnedFd>, Option<UnixStream>), Gate> {
    let mut out = Vec::with_capacity(ids.len() * (HEADER_LEN + 24));
    for id in ids {
        out.extend_from_slice(
            &FetchRequest {
                serial: id.serial,
                ..request
            }
            .encode(),
        );
    }
    let left = remaining(deadline).ok_or_else(|| Gate::TimedOut("before sending".into()))?;
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| Gate::Other(e.to_string()))?;
    if let Err(e) = send_all(&stream, &out) {
        // A responder that refused the connection ("busy") wrote why before closing it.
        return Err(
            refusal_waiting(&stream).unwrap_or_else(|| timed_out("sending the request", &e))
        );
    }
    let mut fds = Vec::with_capacity(ids.len());
    let mut input: Vec<u8> = Vec::new();
    let mut pending_fds: Vec<OwnedFd> = Vec::new();
    for id in ids {
        let reply = loop {
            match Reply::decode(&input) {
                Ok(Parsed::Frame(reply, used)) => {
                    input.drain(..used);
                    break reply;
                }
                Ok(Parsed::Incomplete(_)) => {}
                Err(e) => {
                    return Err(Gate::Broken(format!(
                        "the reply does not parse ({}): not an nvfuser-ipc responder of this \
                         version",
                        e.message
                    )))
                }
            }
            let left = remaining(deadline)
                .ok_or_else(|| Gate::TimedOut("waiting for the reply".into()))?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| Gate::Other(e.to_string()))?;
            let mut buf = [0u8; HEADER_LEN + MAX_BODY];
            match sys::recv_with_fd(stream.as_fd(), &mut buf) {
                Ok((0, _)) => {
                    return Err(Gate::Broken(
                        "the responder closed the connection without replying".into(),
                    ))
                }
                Ok((n, fd)) => {
                    input.extend_from_slice(&buf[..n]);
                    pending_fds.extend(fd);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(timed_out("waiting for the reply", &e)),
            }
        };
        match reply {
            Reply::Fd { serial, dev, ino } => {
                if serial != id.serial {
                    return Err(Gate::Broken(format!(
                        "asked for fd id {}, the reply is for {serial}",
                        id.serial
                    )));
                }
                if pending_fds.is_empty() {
                    return Err(Gate::Broken(
                        "an fd reply came without a descriptor attached".into(),
                    ));
                }
                let fd = pending_fds.remove(0);
                if (dev, ino) != (id.dev, id.ino) {
                    return Err(Gate::NotTheObject(format!(
                        "the responder sent file {dev}:{ino} for fd id {}, registered as {}:{}",
                        id.serial, id.dev, id.ino
                    )));
                }
                fds.push(fd);
            }
            Reply::Error { code, message, .. } => return Err(Gate::Refused { code, message }),
        }
    }
    let in_step = input.is_empty() && pending_fds.is_empty();
    Ok((fds, in_step.then_some(stream)))
}

/// Writes all of `bytes` with `send(MSG_NOSIGNAL)`: a responder that closed gives EPIPE, never
/// a SIGPIPE that would kill a host process whose SIGPIPE disposition is the default.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match sys::send_with_fd(stream.as_fd(), bytes, None) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The error frame already received on `stream`, if any (without waiting).
fn refusal_waiting(stream: &UnixStream) -> Option<Gate> {
    stream.set_nonblocking(true).ok()?;
    let mut buf = [0u8; HEADER_LEN + MAX_BODY];
    let (n, _) = sys::recv_with_fd(stream.as_fd(), &mut buf).ok()?;
    match Reply::decode(&buf[..n]) {
        Ok(Parsed::Frame(Reply::Error { code, message, .. }, _)) => {
            Some(Gate::Refused { code, message })
        }
        _ => None,
    }
}

/// Whether a gate from a socket rung is the exporter's own answer about the object (unknown or
/// revoked): then no other rung can do better.
pub fn is_definitive(gate: &Gate) -> bool {
    matches!(
        gate,
        Gate::Refused {
            code: ErrorCode::UnknownId | ErrorCode::Revoked,
            ..
        }
    )
}

/// Takes descriptor `id.fd` of process `pid` with `pidfd_getfd`, and checks it is the same file
/// that was registered (a number reused after an unregister is refused).
pub fn fetch_with_pidfd(pid: u32, id: &FdId, exporter_ptracer: &str) -> Result<OwnedFd, Gate> {
    let pidfd = sys::pidfd_open(pid).map_err(|e| pidfd_gate_of(&e, exporter_ptracer, pid))?;
    let fd = sys::pidfd_getfd(pidfd.as_fd(), id.fd)
        .map_err(|e| pidfd_gate_of(&e, exporter_ptracer, pid))?;
    let got = sys::file_identity(fd.as_fd()).map_err(|e| Gate::Other(format!("fstat: {e}")))?;
    if got != (id.dev, id.ino) {
        return Err(Gate::NotTheObject(format!(
            "descriptor {} of pid {pid} is now file {}:{}, not the registered {}:{}: the \
             object was unregistered",
            id.fd, got.0, got.1, id.dev, id.ino
        )));
    }
    Ok(fd)
}
