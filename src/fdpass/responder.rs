//! The responder: one thread per process and job running a mio loop over its two listeners and
//! its connections, always ready to hand out registered descriptors (docs/ARCHITECTURE.md,
//! "Passing file descriptors"; who is served: PROTOCOL.md section 7, "Trust boundary").

use super::frame::{ErrorCode, FetchRequest, Parsed, Reply, Secret};
use super::registry::Registry;
use super::FdPassConfig;
use crate::error::{Error, Result};
use crate::logging;
use crate::os::fd_passing as sys;
use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ABSTRACT: Token = Token(0);
const PATH: Token = Token(1);
const WAKER: Token = Token(2);
const FIRST_CONN: usize = 3;
/// Input a connection may hold unparsed: many pipelined requests, never an endless stream.
const MAX_INPUT: usize = 64 * 1024;
/// Replies queued per connection before its input stops being read.
const MAX_QUEUED: usize = 256;
/// Refusals logged per window; the rest are counted and summed up in the next window's line.
const LOGGED_REFUSALS: u32 = 5;
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

/// What a responder has done so far (for tests and diagnostics).
#[derive(Default, Debug)]
pub struct ResponderStats {
    pub accepted: AtomicU64,
    pub fds_sent: AtomicU64,
    pub refused: AtomicU64,
    pub malformed: AtomicU64,
    /// Connections and requests denied: another uid, or no secret (not of this job).
    pub denied: AtomicU64,
}

/// A running responder; stopped and cleaned up on drop.
pub struct Responder {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
    /// The socket file and its slot in the exit-time cleanup table (see `os::cleanup`).
    path: Option<(PathBuf, Option<usize>)>,
    stats: Arc<ResponderStats>,
}

/// Binds a listener on `addr`, non-blocking, for mio.
fn listen(addr: &SocketAddr) -> io::Result<UnixListener> {
    let l = std::os::unix::net::UnixListener::bind_addr(addr)?;
    l.set_nonblocking(true)?;
    Ok(UnixListener::from_std(l))
}

/// Binds the socket file at `path` (replacing a leftover socket of this uid) and makes it `0600`;
/// `Err` says why not, for the published record.
fn listen_path(path: &Path, uid: u32) -> std::result::Result<UnixListener, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() && m.uid() == uid {
            let _ = std::fs::remove_file(path);
        }
    }
    let addr = SocketAddr::from_pathname(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let listener = listen(&addr).map_err(|e| {
        format!(
            "cannot listen on {} ({e}): set NVFIPC_SOCKET_DIR to a writable directory",
            path.display()
        )
    })?;
    // The directory already keeps others out; the file's own mode says the same.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    Ok(listener)
}

impl Responder {
    /// Listens on `abstract_name` and `path` (when usable), spawns the serving thread; returns
    /// the responder and the path it listens on, or why not.
    pub fn start(
        registry: Arc<Registry>,
        nonce: u64,
        secret: Secret,
        abstract_name: &str,
        path: std::result::Result<PathBuf, String>,
        config: &FdPassConfig,
        who: &str,
    ) -> Result<(Responder, std::result::Result<PathBuf, String>)> {
        let failed = |what: &str| {
            let what = format!("{who}: {what}");
            move |e: io::Error| Error::from_io(what, &e)
        };
        let addr = SocketAddr::from_abstract_name(abstract_name.as_bytes())
            .map_err(failed(&format!("abstract name @{abstract_name}")))?;
        let mut abs = listen(&addr).map_err(failed(&format!(
            "fd transport cannot listen on the abstract socket @{abstract_name}"
        )))?;
        let uid = sys::effective_uid();
        let mut file = None;
        let path = path.and_then(|p| {
            let l = listen_path(&p, uid)?;
            file = Some(l);
            Ok(p)
        });
        let cleanup =
            (path.as_ref().ok()).map(|p| (p.clone(), crate::os::cleanup::register_path(p)));
        let poll = Poll::new().map_err(failed("epoll"))?;
        let reg = poll.registry();
        reg.register(&mut abs, ABSTRACT, Interest::READABLE)
            .map_err(failed("epoll_ctl"))?;
        if let Some(l) = file.as_mut() {
            reg.register(l, PATH, Interest::READABLE)
                .map_err(failed("epoll_ctl"))?;
        }
        let waker = Arc::new(Waker::new(reg, WAKER).map_err(failed("eventfd"))?);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ResponderStats::default());
        let mut serve = Loop {
            poll,
            listeners: [Some(abs), file],
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            registry,
            guard: Guard {
                nonce,
                secret,
                trusted: config.trusted.clone(),
                who: who.to_string(),
                log: RefusalLog::default(),
            },
            idle: config.idle_timeout,
            max_connections: config.max_connections.max(1),
            stop: stop.clone(),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("nvfipc-fdpass".into())
            .spawn(move || serve.run())
            .map_err(failed("spawning the fd responder thread"))?;
        let responder = Responder {
            stop,
            waker,
            thread: Some(thread),
            path: cleanup,
            stats,
        };
        Ok((responder, path))
    }

    pub fn stats(&self) -> &ResponderStats {
        &self.stats
    }

    /// Whether the serving thread is still running.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((p, slot)) = self.path.take() {
            let _ = std::fs::remove_file(p);
            if let Some(slot) = slot {
                crate::os::cleanup::unregister(slot);
            }
        }
    }
}

struct Conn {
    stream: UnixStream,
    /// Who connected, as the kernel says (`SO_PEERCRED`).
    peer: sys::PeerCred,
    input: Vec<u8>,
    /// Replies not yet fully written: bytes, bytes written, the fd for the first byte.
    output: VecDeque<(Vec<u8>, usize, Option<Arc<OwnedFd>>)>,
    /// Close once `output` is written (after an error frame for a malformed request).
    closing: bool,
    last_active: Instant,
}

struct Loop {
    poll: Poll,
    listeners: [Option<UnixListener>; 2],
    conns: HashMap<Token, Conn>,
    next_token: usize,
    registry: Arc<Registry>,
    guard: Guard,
    idle: Duration,
    max_connections: usize,
    stop: Arc<AtomicBool>,
    stats: Arc<ResponderStats>,
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        while !self.stop.load(Ordering::SeqCst) {
            let tick = self.next_expiry();
            if let Err(e) = self.poll.poll(&mut events, Some(tick)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // epoll_wait failing otherwise means the loop cannot go on; importers then see
                // "no responder answers" with the reason on their side.
                break;
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    ABSTRACT => self.accept(0),
                    PATH => self.accept(1),
                    token => self.drive(token),
                }
            }
            self.expire();
        }
    }

    fn next_expiry(&self) -> Duration {
        let now = Instant::now();
        self.conns
            .values()
            .map(|c| (c.last_active + self.idle).saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(3600))
            .max(Duration::from_millis(1))
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let idle = self.idle;
        let expired: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| now.duration_since(c.last_active) >= idle)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            self.close(t);
        }
    }

    fn accept(&mut self, which: usize) {
        loop {
            let Some(listener) = self.listeners[which].as_ref() else {
                return;
            };
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors or similar: the pending connection stays queued and the
                // listener is polled again at the next event or tick.
                Err(_) => return,
            };
            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
            let peer = match sys::peer_credentials(stream.as_fd()) {
                Ok(peer) if self.guard.trusted.admits(peer.uid) => peer,
                seen => {
                    let why = match seen {
                        Ok(peer) => format!(
                            "pid {} runs as uid {}; this responder serves only processes of \
                             {} (run every rank of a job as one user, or list the job's \
                             other users in NVFIPC_TRUSTED_UIDS)",
                            peer.pid,
                            peer.uid,
                            self.guard.trusted.describe()
                        ),
                        Err(e) => format!("the peer's credentials cannot be read ({e})"),
                    };
                    let denied = error_frame(ErrorCode::Denied, 0, why.clone());
                    let _ = sys::send_with_fd(stream.as_fd(), &denied, None);
                    self.stats.denied.fetch_add(1, Ordering::Relaxed);
                    self.guard
                        .log
                        .refused(&self.guard.who, &format!("connection: {why}"));
                    continue;
                }
            };
            if self.conns.len() >= self.max_connections {
                let busy = error_frame(
                    ErrorCode::Busy,
                    0,
                    format!(
                        "the responder serves {} connections already: retry",
                        self.conns.len()
                    ),
                );
                let _ = sys::send_with_fd(stream.as_fd(), &busy, None);
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let token = Token(self.next_token);
            self.next_token += 1;
            if self
                .poll
                .registry()
                .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                continue;
            }
            self.conns.insert(
                token,
                Conn {
                    stream,
                    peer,
                    input: Vec::new(),
                    output: VecDeque::new(),
                    closing: false,
                    last_active: Instant::now(),
                },
            );
            // Requests may already be there; edge-triggered readiness will report them too.
            self.drive(token);
        }
    }

    fn close(&mut self, token: Token) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
    }

    fn drive(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if serve(conn, &self.registry, &mut self.guard, &self.stats) {
            self.close(token);
        }
    }
}

/// What every request is checked against, and the log of refusals.
struct Guard {
    nonce: u64,
    secret: Secret,
    /// Whose processes are served.
    trusted: super::TrustedUids,
    /// "rank 0 of job j", for log lines.
    who: String,
    log: RefusalLog,
}

/// Refusals logged as warnings, at most [`LOGGED_REFUSALS`] per [`REFUSAL_WINDOW`]; the count of
/// those not shown comes with the next line.
#[derive(Default)]
struct RefusalLog {
    window: Option<Instant>,
    shown: u32,
    hidden: u64,
}

impl RefusalLog {
    fn refused(&mut self, who: &str, what: &str) {
        let now = Instant::now();
        if self
            .window
            .map_or(true, |start| now.duration_since(start) >= REFUSAL_WINDOW)
        {
            self.window = Some(now);
            self.shown = 0;
        }
        if self.shown >= LOGGED_REFUSALS {
            self.hidden += 1;
            return;
        }
        self.shown += 1;
        let hidden = std::mem::take(&mut self.hidden);
        let more = if hidden > 0 {
            format!(" ({hidden} earlier refusals not logged)")
        } else {
            String::new()
        };
        log::warn!(target: logging::HOST, "{who}: fd responder denied a {what}{more}");
    }
}

/// Writes what the kernel takes; true when all is written, `Err` when the connection broke.
fn flush(conn: &mut Conn) -> std::result::Result<bool, ()> {
    while let Some((bytes, done, fd)) = conn.output.front_mut() {
        let fd_now = if *done == 0 {
            fd.as_ref().map(|f| f.as_fd())
        } else {
            None
        };
        match sys::send_with_fd(conn.stream.as_fd(), &bytes[*done..], fd_now) {
            Ok(n) => {
                *done += n;
                conn.last_active = Instant::now();
                if *done == bytes.len() {
                    conn.output.pop_front();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(()),
        }
    }
    Ok(true)
}

/// Serves one connection as far as it can go now (flush, parse, answer, read); true: close it.
fn serve(conn: &mut Conn, registry: &Registry, guard: &mut Guard, stats: &ResponderStats) -> bool {
    loop {
        match flush(conn) {
            Err(()) => return true,
            Ok(false) => return false,
            Ok(true) if conn.closing => return true,
            Ok(true) => {}
        }
        // Answer every complete request in the input.
        let mut answered = false;
        while conn.output.len() < MAX_QUEUED {
            match FetchRequest::decode(&conn.input) {
                Ok(Parsed::Frame(req, used)) => {
                    conn.input.drain(..used);
                    answered = true;
                    // A stale record is told as such (the nonce is public); past it, a request
                    // without the secret is not from this job: refused, and the connection
                    // closed, so nobody tries secrets on it.
                    if req.nonce == guard.nonce && !req.secret.matches(&guard.secret) {
                        stats.denied.fetch_add(1, Ordering::Relaxed);
                        let why = format!(
                            "request for fd id {} from pid {} (uid {}) without this \
                             responder's secret: not a process of this job, or its record of \
                             this responder is not the one published",
                            req.serial, conn.peer.pid, conn.peer.uid
                        );
                        guard.log.refused(&guard.who, &why);
                        let reply = error_frame(ErrorCode::Denied, req.serial, why);
                        conn.output.push_back((reply, 0, None));
                        conn.input.clear();
                        conn.closing = true;
                        break;
                    }
                    conn.output
                        .push_back(answer(&req, registry, guard.nonce, stats));
                }
                Ok(Parsed::Incomplete(_)) => break,
                Err(e) => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    let reply = error_frame(e.code, 0, e.message);
                    conn.output.push_back((reply, 0, None));
                    conn.input.clear();
                    conn.closing = true;
                    answered = true;
                    break;
                }
            }
        }
        if answered {
            continue;
        }
        if conn.output.len() >= MAX_QUEUED {
            return false;
        }
        // Read what arrived.
        let mut buf = [0u8; 4096];
        match conn.stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                conn.last_active = Instant::now();
                if conn.input.len() + n > MAX_INPUT {
                    // A peer that sends this much without completing a request is not ours.
                    return true;
                }
                conn.input.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

/// The reply to one well-formed request, with the descriptor when there is one.
fn answer(
    req: &FetchRequest,
    registry: &Registry,
    nonce: u64,
    stats: &ResponderStats,
) -> (Vec<u8>, usize, Option<Arc<OwnedFd>>) {
    let refuse = |code: ErrorCode, message: String| {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        (error_frame(code, req.serial, message), 0, None)
    };
    if req.nonce != nonce {
        return refuse(
            ErrorCode::WrongNonce,
            format!(
                "request from rank {} (pid {}) names nonce {:016x}, this responder's is \
                 {nonce:016x}: the record it read is stale (a restarted process or another job)",
                req.rank, req.pid, req.nonce
            ),
        );
    }
    match registry.lookup(req.serial) {
        Ok(fd) => match sys::file_identity(fd.as_fd()) {
            Ok((dev, ino)) => {
                stats.fds_sent.fetch_add(1, Ordering::Relaxed);
                let reply = Reply::Fd {
                    serial: req.serial,
                    dev,
                    ino,
                };
                (reply.encode(), 0, Some(fd))
            }
            Err(e) => refuse(
                ErrorCode::Internal,
                format!("fstat of the registered fd: {e}"),
            ),
        },
        Err(code) => refuse(
            code,
            match code {
                ErrorCode::Revoked => format!(
                    "fd id {} was unregistered by its exporter before rank {} (pid {}) asked \
                     for it",
                    req.serial, req.rank, req.pid
                ),
                _ => format!(
                    "no fd id {} was ever registered here (asked by rank {}, pid {})",
                    req.serial, req.rank, req.pid
                ),
            },
        ),
    }
}

fn error_frame(code: ErrorCode, serial: u64, message: String) -> Vec<u8> {
    Reply::Error {
        code,
        serial,
        message,
    }
    .encode()
}
