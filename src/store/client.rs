//! Client for PyTorch's TCPStore wire protocol, behaving on the wire like torch 2.11's C++
//! client (`c10d::TCPStore`), so it works against torch's servers (libuv and classic) and ours.
//!
//! - Connect: `getaddrinfo` (AF_INET6 with v4-mapped addresses, then AF_INET), a non-blocking
//!   connect per address, retried with jittered exponential backoff on ECONNREFUSED, ECONNRESET
//!   and ETIMEDOUT until `connect_timeout`; then `VALIDATE` and `PING` (nonce = pid, echo checked);
//!   then `ADD "init/" 1` when [`ConnectOptions::wait_for_workers`] is set.
//! - User keys get torch's `/` prefix on the wire (`"init/"` does not).
//! - `get`, `wait`, `multi_get` and a blocking `queue_pop` send `WAIT` first and wait for its reply
//!   with `poll`; on timeout they send `CANCEL_WAIT` and report a [`Status::Timeout`] with torch's
//!   text (`wait timeout after 1000ms, keys: /nokey`).
//! - Unlike torch, which blocks forever in `recv` when a server stops answering, every reply read
//!   here is bounded by the store timeout (at least [`MIN_REPLY_TIMEOUT`]).
//! - Requests over the limits of torch's default server (a wire key, `/` included, over
//!   8192 bytes, a value over 8 MiB, more than 131072 keys) are refused with
//!   [`Status::InvalidArgument`] before anything is sent; the connection stays usable.
//! - One connection behind a mutex, one request in flight, each request written with one
//!   syscall from a reused buffer. After an I/O or protocol error the connection is marked broken
//!   and later calls fail at once (the stream may be out of step); call [`TcpStore::reconnect`] or
//!   create a new store.

use crate::error::{Error, Result, Status};
use crate::store::wire::{self, Prefixed, WAIT_CANCELED, WAIT_STOP_WAITING};
use crate::store::{Store, DEFAULT_TIMEOUT};
use std::ffi::CString;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// The key every torch store with a world size increments once after connecting (no `/`).
pub const INIT_KEY: &str = "init/";
/// Prefix torch's client puts before every user key.
const KEY_PREFIX: &str = "/";
/// Reply reads never time out faster than this, even with a store timeout of 0 (which, as in
/// torch, only means "do not wait" for `WAIT`-based operations).
pub const MIN_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// Size of the reused reply buffer; larger values are read straight into the result.
const READ_BUFFER_SIZE: usize = 64 * 1024;
/// The request buffer is shrunk back after a request larger than this.
const KEEP_OUT_CAPACITY: usize = 1 << 20;
/// First connect retry delay; short because ranks usually start at the same time as the server.
const BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const BACKOFF_FACTOR: f64 = 1.5;
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most this many keys are named in a wait-timeout message.
const KEYS_IN_MESSAGE: usize = 16;

/// How to connect to a TCPStore server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Store timeout: bounds `get`/`wait`/`multi_get` and every reply read. Default 300 s.
    pub timeout: Duration,
    /// How long to keep retrying the connection (connect, VALIDATE, PING). Default 300 s, the
    /// same as the store timeout, as in torch.
    pub connect_timeout: Duration,
    /// `Some(world_size)`: send `ADD "init/" 1` after connecting, like a torch store created
    /// with `world_size` and `wait_for_workers=True` (a torch master waits for these).
    pub wait_for_workers: Option<usize>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_TIMEOUT,
            wait_for_workers: None,
        }
    }
}

impl ConnectOptions {
    /// Options with both the store and the connect timeout set to `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        ConnectOptions {
            timeout,
            connect_timeout: timeout,
            wait_for_workers: None,
        }
    }
}

/// A connection to a TCPStore server. Thread-safe; calls are serialized on one connection.
pub struct TcpStore {
    host: String,
    port: u16,
    connect_timeout: Duration,
    /// Store timeout in nanoseconds; read without the connection lock.
    timeout_ns: AtomicU64,
    conn: Mutex<Conn>,
}

impl fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStore")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("timeout", &self.timeout())
            .finish_non_exhaustive()
    }
}

/// Why a request failed, before it is turned into an [`Error`] with the store's address.
enum Fail {
    /// The request was refused before anything was sent (limits); the connection is fine.
    Invalid(Error),
    /// A WAIT ran out of this much time and was cancelled cleanly; the connection is fine.
    WaitTimeout(Duration),
    /// send/recv failed, the server closed, or a reply was malformed: the stream is unusable.
    Io(io::Error),
    Protocol(String),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Fail::Io(e)
    }
}

type Step<T> = std::result::Result<T, Fail>;

/// Reads from the socket with a per-reply deadline: each `read` is bounded by `SO_RCVTIMEO`, and
/// a reply that needs several reads fails once the deadline set at its first read has passed.
struct SocketReader {
    stream: TcpStream,
    timeout: Duration,
    deadline: Option<Instant>,
}

impl Read for SocketReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let now = Instant::now();
        match self.deadline {
            None => self.deadline = Some(now + self.timeout),
            Some(deadline) if now >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "reply not complete within the store timeout",
                ))
            }
            Some(_) => {}
        }
        (&self.stream).read(buf)
    }
}

/// The one connection: socket, reused request and reply buffers, and whether it is usable.
struct Conn {
    reader: BufReader<SocketReader>,
    out: Vec<u8>,
    /// Set after an I/O or protocol error: the reason, repeated to later callers.
    broken: Option<String>,
}

impl Conn {
    fn new(stream: TcpStream, reply_timeout: Duration) -> io::Result<Conn> {
        stream.set_read_timeout(Some(reply_timeout))?;
        stream.set_write_timeout(Some(reply_timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(
                READ_BUFFER_SIZE,
                SocketReader {
                    stream,
                    timeout: reply_timeout,
                    deadline: None,
                },
            ),
            out: Vec::with_capacity(4096),
            broken: None,
        })
    }

    fn stream(&self) -> &TcpStream {
        &self.reader.get_ref().stream
    }

    /// Applies a changed store timeout to the socket (`set_timeout` does not take the lock).
    fn apply_reply_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        if self.reader.get_ref().timeout != timeout {
            self.stream().set_read_timeout(Some(timeout))?;
            self.stream().set_write_timeout(Some(timeout))?;
            self.reader.get_mut().timeout = timeout;
        }
        Ok(())
    }

    /// Encodes one request into the reused buffer (nothing is sent when encoding fails).
    fn encode(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Step<()> {
        self.out.clear();
        encode(&mut self.out).map_err(Fail::Invalid)
    }

    /// Writes the encoded request (one syscall unless the kernel takes it partially) and starts
    /// the deadline of its reply afresh.
    fn send(&mut self) -> Step<()> {
        let result = self.stream().write_all(&self.out);
        if self.out.capacity() > KEEP_OUT_CAPACITY {
            self.out = Vec::with_capacity(4096);
        }
        self.reader.get_mut().deadline = None;
        result.map_err(Fail::Io)
    }

    fn request(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Step<()> {
        self.encode(encode)?;
        self.send()
    }

    /// Sends `WAIT keys` and waits up to `timeout` for its reply; on timeout cancels the wait
    /// (a late `00 01` means the keys arrived: success; `01` returns [`Fail::WaitTimeout`]).
    fn wait<'k>(
        &mut self,
        keys: impl IntoIterator<Item = Prefixed<'k>>,
        timeout: Duration,
    ) -> Step<()> {
        self.request(|out| wire::encode_wait(out, keys))?;
        self.finish_wait(timeout)
    }

    /// Waits up to `timeout` for the reply of a WAIT already sent, cancelling it on timeout.
    fn finish_wait(&mut self, timeout: Duration) -> Step<()> {
        if self.reader.buffer().is_empty() && !poll_readable(self.stream(), timeout)? {
            self.request(|out| {
                wire::encode_cancel_wait(out);
                Ok(())
            })?;
            let first = wire::read_u8(&mut self.reader)?;
            // `00 01`: every key arrived just before the cancel. The wait was satisfied, so
            // report success (torch reports a timeout here; its callers then retry or fail).
            let satisfied = first == WAIT_STOP_WAITING;
            let reply = if satisfied {
                wire::read_u8(&mut self.reader)?
            } else {
                first
            };
            if reply != WAIT_CANCELED {
                return Err(Fail::Protocol(format!(
                    "CANCEL_WAIT reply was byte {reply:#04x}, expected {WAIT_CANCELED:#04x}"
                )));
            }
            if satisfied {
                return Ok(());
            }
            return Err(Fail::WaitTimeout(timeout));
        }
        self.expect_byte("WAIT", WAIT_STOP_WAITING)
    }

    fn expect_byte(&mut self, what: &str, expected: u8) -> Step<()> {
        let got = wire::read_u8(&mut self.reader)?;
        if got != expected {
            return Err(Fail::Protocol(format!(
                "{what} reply was byte {got:#04x}, expected {expected:#04x}"
            )));
        }
        Ok(())
    }
}

/// `poll(POLLIN)` on the socket for up to `timeout`; true when a reply can be read.
fn poll_readable(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up so that a sub-millisecond remainder still waits instead of spinning.
        let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid, initialized pollfd that lives across the call, and the
        // count passed is 1; the fd belongs to `stream`, which outlives the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            // POLLHUP/POLLERR also count: the following read reports what happened.
            return Ok(true);
        }
        if rc == 0 {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            continue;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// A user key as torch puts it on the wire.
fn user_key(key: &str) -> Prefixed<'_> {
    Prefixed::new(KEY_PREFIX, key)
}

fn user_keys<'k>(keys: &'k [&'k str]) -> impl Iterator<Item = Prefixed<'k>> + 'k {
    keys.iter().map(|k| user_key(k))
}

/// Wire keys joined like torch's timeout message (`/a, /b`), shortened for long lists.
fn describe_keys(keys: &[&str]) -> String {
    let mut s = String::new();
    for (i, k) in keys.iter().take(KEYS_IN_MESSAGE).enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(KEY_PREFIX);
        s.push_str(k);
    }
    if keys.len() > KEYS_IN_MESSAGE {
        s.push_str(&format!(", ... ({} more)", keys.len() - KEYS_IN_MESSAGE));
    }
    s
}

impl TcpStore {
    /// Connects to the TCPStore server at `host:port` (retrying until `opts.connect_timeout`),
    /// validates the connection like torch's client, and sends `ADD "init/" 1` when
    /// `opts.wait_for_workers` is set.
    pub fn connect(host: &str, port: u16, opts: &ConnectOptions) -> Result<TcpStore> {
        if opts.wait_for_workers == Some(0) {
            return Err(Error::invalid(format!(
                "store {host}:{port}: wait_for_workers must be a world size of at least 1 \
                 (use None to not announce this client)"
            )));
        }
        let store = TcpStore {
            host: host.to_owned(),
            port,
            connect_timeout: opts.connect_timeout,
            timeout_ns: AtomicU64::new(duration_ns(opts.timeout)),
            conn: Mutex::new(open(host, port, opts.connect_timeout, opts.timeout)?),
        };
        if opts.wait_for_workers.is_some() {
            store.call("ADD", &[], |c| {
                c.request(|out| wire::encode_add(out, INIT_KEY, 1))?;
                Ok(wire::read_i64(&mut c.reader)?)
            })?;
        }
        Ok(store)
    }

    /// Replaces the connection with a new one (connect, VALIDATE, PING; no `ADD "init/"`),
    /// e.g. after an error left the old one unusable.
    pub fn reconnect(&self) -> Result<()> {
        let fresh = open(&self.host, self.port, self.connect_timeout, self.timeout())?;
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
        // The new connection is clean even if a panic poisoned the lock of the old one.
        self.conn.clear_poison();
        Ok(())
    }

    /// The host name this store was connected with.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port this store was connected with.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address the connection actually reached (after name resolution).
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        let conn = self.lock();
        conn.stream().peer_addr().map_err(|e| {
            Error::from_io(
                format!("store {}:{}: peer address", self.host, self.port),
                &e,
            )
        })
    }

    /// The store timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Changes the store timeout (used by waits and reply reads from the next call on).
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ns
            .store(duration_ns(timeout), Ordering::Relaxed);
    }

    /// Round trip of a `PING` (the nonce is the process id); returns how long it took.
    pub fn ping(&self) -> Result<Duration> {
        let start = Instant::now();
        let nonce = std::process::id();
        self.call("PING", &[], |c| {
            c.request(|out| {
                wire::encode_ping(out, nonce);
                Ok(())
            })?;
            let echoed = wire::read_u32(&mut c.reader)?;
            if echoed != nonce {
                return Err(Fail::Protocol(format!(
                    "PING echoed {echoed}, expected {nonce}"
                )));
            }
            Ok(())
        })?;
        Ok(start.elapsed())
    }

    /// Appends `value` to the FIFO queue `key` (torch >= 2.8, libuv server only: a classic
    /// server closes the connection).
    pub fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("QUEUE_PUSH", &[], |c| {
            c.request(|out| wire::encode_queue_push(out, &user_key(key), value))
        })
    }

    /// Pops the oldest value of queue `key`. With `Some(timeout)` it first waits (like torch's
    /// `block=True`) until the queue is non-empty; `Ok(None)` means the queue was empty.
    pub fn queue_pop(&self, key: &str, wait: Option<Duration>) -> Result<Option<Vec<u8>>> {
        self.call("QUEUE_POP", &[key], |c| {
            if let Some(timeout) = wait {
                c.wait(std::iter::once(user_key(key)), timeout)?;
            }
            c.request(|out| wire::encode_queue_pop(out, &user_key(key)))?;
            Ok(wire::read_queue_pop(&mut c.reader)?)
        })
    }

    /// Number of values in queue `key` (0 when there is no such queue).
    pub fn queue_len(&self, key: &str) -> Result<i64> {
        self.call("QUEUE_LEN", &[], |c| {
            c.request(|out| wire::encode_queue_len(out, &user_key(key)))?;
            Ok(wire::read_i64(&mut c.reader)?)
        })
    }

    /// The user keys in the store (torch >= 2.10), like torch's `list_keys()`: the leading `/` is
    /// removed and keys without it (such as `init/`) are left out. Keys that are not UTF-8 are
    /// converted lossily.
    pub fn list(&self) -> Result<Vec<String>> {
        let keys = self.call("LIST", &[], |c| {
            c.request(|out| {
                wire::encode_list(out);
                Ok(())
            })?;
            Ok(wire::read_list(&mut c.reader)?)
        })?;
        Ok(keys
            .iter()
            .filter_map(|k| k.strip_prefix(KEY_PREFIX.as_bytes()))
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect())
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        // A panic while holding the lock could have left a request half written.
        self.conn.lock().unwrap_or_else(|poisoned| {
            let mut conn = poisoned.into_inner();
            conn.broken
                .get_or_insert_with(|| "a thread panicked during a request".to_owned());
            conn
        })
    }

    /// Runs one operation on the connection and turns its failure into an [`Error`] naming
    /// the store and operation; any failure other than a clean timeout or a refused request
    /// marks the connection broken. `wait_keys` are the keys named by a wait timeout.
    fn call<T>(
        &self,
        op: &'static str,
        wait_keys: &[&str],
        body: impl FnOnce(&mut Conn) -> Step<T>,
    ) -> Result<T> {
        let timeout = self.timeout();
        let mut conn = self.lock();
        if let Some(reason) = &conn.broken {
            return Err(Error::state(format!(
                "store {}: {op} refused: the connection is unusable after an earlier error \
                 ({reason}); reconnect or create a new store",
                self.addr()
            )));
        }
        let step = conn
            .apply_reply_timeout(timeout.max(MIN_REPLY_TIMEOUT))
            .map_err(Fail::Io)
            .and_then(|()| body(&mut conn));
        let fail = match step {
            Ok(v) => return Ok(v),
            Err(fail) => fail,
        };
        let err = match fail {
            Fail::Invalid(e) => return Err(e.context(format!("store {}", self.addr()))),
            Fail::WaitTimeout(waited) => {
                return Err(Error::timeout(format!(
                    "wait timeout after {}ms, keys: {} (store {}, {op})",
                    waited.as_millis(),
                    describe_keys(wait_keys),
                    self.addr()
                )))
            }
            Fail::Io(e) => io_error(&self.addr(), op, &e),
            Fail::Protocol(msg) => Error::protocol(format!(
                "store {}: {op}: {msg}; the connection is out of step and now unusable",
                self.addr()
            )),
        };
        conn.broken = Some(err.message.clone());
        Err(err)
    }
}

fn duration_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

fn io_error(addr: &str, op: &str, e: &io::Error) -> Error {
    let what = match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            "the server closed the connection (server gone, or it rejected the request)".to_owned()
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "no reply within the store timeout (server hung or unreachable)".to_owned()
        }
        io::ErrorKind::InvalidData => format!("malformed reply: {e}"),
        _ => e.to_string(),
    };
    let status = if e.kind() == io::ErrorKind::InvalidData {
        Status::Protocol
    } else {
        Status::Io
    };
    Error::new(
        status,
        format!("store {addr}: {op} failed: {what}; the connection is now unusable"),
    )
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("SET", &[], |c| {
            c.request(|out| wire::encode_set(out, &user_key(key), value))
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.call("GET", &[key], |c| {
            c.wait(std::iter::once(user_key(key)), timeout)?;
            c.request(|out| wire::encode_get(out, &user_key(key)))?;
            Ok(wire::read_blob(&mut c.reader)?)
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.call("ADD", &[], |c| {
            c.request(|out| wire::encode_add(out, &user_key(key), delta))?;
            Ok(wire::read_i64(&mut c.reader)?)
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.call("CHECK", &[], |c| {
            c.request(|out| wire::encode_check(out, user_keys(keys)))?;
            match wire::read_u8(&mut c.reader)? {
                wire::CHECK_READY => Ok(true),
                wire::CHECK_NOT_READY => Ok(false),
                other => Err(Fail::Protocol(format!(
                    "CHECK reply was byte {other:#04x}, expected 0x00 or 0x01"
                ))),
            }
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.call("WAIT", keys, |c| c.wait(user_keys(keys), timeout))
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.call("DELETE_KEY", &[], |c| {
            c.request(|out| wire::encode_delete_key(out, &user_key(key)))?;
            Ok(wire::read_i64(&mut c.reader)? == 1)
        })
    }

    fn num_keys(&self) -> Result<i64> {
        self.call("GETNUMKEYS", &[], |c| {
            c.request(|out| {
                wire::encode_get_num_keys(out);
                Ok(())
            })?;
            Ok(wire::read_i64(&mut c.reader)?)
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call("COMPARE_SET", &[], |c| {
            c.request(|out| wire::encode_compare_set(out, &user_key(key), expected, desired))?;
            Ok(wire::read_blob(&mut c.reader)?)
        })
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("APPEND", &[], |c| {
            c.request(|out| wire::encode_append(out, &user_key(key), value))
        })
    }

    fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        self.call("MULTI_SET", &[], |c| {
            c.request(|out| {
                wire::encode_multi_set(out, pairs.iter().map(|(k, v)| (user_key(k), *v)))
            })
        })
    }

    fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.call("MULTI_GET", keys, |c| {
            c.wait(user_keys(keys), timeout)?;
            c.request(|out| wire::encode_multi_get(out, user_keys(keys)))?;
            Ok(wire::read_blobs(&mut c.reader, keys.len())?)
        })
    }

    fn update_then_wait(
        &self,
        delete: &[&str],
        set: Option<(&str, &[u8])>,
        wait: &[&str],
        timeout: Duration,
    ) -> Result<()> {
        self.call("DELETE_KEY/SET/WAIT", wait, |c| {
            c.request(|out| {
                for old in delete {
                    wire::encode_delete_key(out, &user_key(old))?;
                }
                if let Some((key, value)) = set {
                    wire::encode_set(out, &user_key(key), value)?;
                }
                if wait.is_empty() {
                    return Ok(());
                }
                wire::encode_wait(out, user_keys(wait))
            })?;
            for _ in delete {
                wire::read_i64(&mut c.reader)?;
            }
            if wait.is_empty() {
                return Ok(());
            }
            c.finish_wait(timeout)
        })
    }

    fn default_timeout(&self) -> Duration {
        self.timeout()
    }
}

// ---------------------------------------------------------------------------------------------
// Connection setup.

/// Connects with retries until `connect_timeout`, then VALIDATE + PING.
fn open(host: &str, port: u16, connect_timeout: Duration, timeout: Duration) -> Result<Conn> {
    let start = Instant::now();
    let deadline = start + connect_timeout;
    let mut backoff = Backoff::new();
    let mut last_error: Option<String> = None;
    let mut attempted = false;
    loop {
        match resolve(host, port) {
            Ok(addrs) => {
                for addr in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    // Even a zero connect timeout gets one try per address.
                    if left.is_zero() && attempted {
                        break;
                    }
                    attempted = true;
                    match try_connect(addr, left.max(Duration::from_millis(1)), timeout) {
                        Ok(conn) => return Ok(conn),
                        Err(e) => last_error = Some(format!("{addr}: {e}")),
                    }
                }
            }
            // Name resolution can fail while a cluster's DNS catches up: retry it too.
            Err(e) => last_error = Some(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "The client socket has timed out after {}ms while trying to connect to \
                 ({host}, {port}); last error: {}. Check that the store server is running \
                 and reachable, or raise the connect timeout",
                start.elapsed().as_millis(),
                last_error.as_deref().unwrap_or("none"),
            )));
        }
        std::thread::sleep(backoff.next_delay().min(left));
    }
}

/// One connection attempt to one address, including the handshake. std creates the socket with
/// `SOCK_CLOEXEC` and connects it non-blocking with `poll(POLLOUT)`, then makes it blocking
/// again, as torch does.
fn try_connect(addr: SocketAddr, left: Duration, timeout: Duration) -> io::Result<Conn> {
    let stream = TcpStream::connect_timeout(&addr, left)?;
    stream.set_nodelay(true)?;
    // The handshake reply is bounded by what is left of the connect deadline too.
    let reply_timeout = timeout.max(MIN_REPLY_TIMEOUT);
    let mut conn = Conn::new(
        stream,
        reply_timeout.min(left.max(Duration::from_millis(1))),
    )?;
    let nonce = std::process::id();
    conn.out.clear();
    wire::encode_validate(&mut conn.out);
    wire::encode_ping(&mut conn.out, nonce);
    match conn.send() {
        Ok(()) => {}
        Err(Fail::Io(e)) => return Err(e),
        Err(_) => return Err(io::Error::other("handshake could not be sent")),
    }
    let echoed = wire::read_u32(&mut conn.reader)?;
    if echoed != nonce {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "Ping failed, invalid value returned from server. Expected: {nonce}, Got: {echoed}"
            ),
        ));
    }
    conn.apply_reply_timeout(reply_timeout)?;
    Ok(conn)
}

/// Resolves like torch: AF_INET6 with `AI_V4MAPPED | AI_ALL` first, then AF_INET.
fn resolve(host: &str, port: u16) -> std::result::Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for family in [libc::AF_INET6, libc::AF_INET] {
        let flags = libc::AI_NUMERICSERV
            | if family == libc::AF_INET6 {
                libc::AI_V4MAPPED | libc::AI_ALL
            } else {
                0
            };
        match getaddrinfo(host, port, family, flags) {
            Ok(found) => {
                for a in found {
                    if !addrs.contains(&a) {
                        addrs.push(a);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if addrs.is_empty() {
        return Err(format!(
            "cannot resolve host {host:?}: {}",
            errors.join("; ")
        ));
    }
    Ok(addrs)
}

/// Safe wrapper over `getaddrinfo` for one address family (stream sockets only).
fn getaddrinfo(
    host: &str,
    port: u16,
    family: libc::c_int,
    flags: libc::c_int,
) -> std::result::Result<Vec<SocketAddr>, String> {
    let c_host = CString::new(host).map_err(|_| format!("host name {host:?} contains NUL"))?;
    let c_port = CString::new(port.to_string()).expect("digits contain no NUL");
    // SAFETY: addrinfo is a plain C struct for which all-zero is a valid "no hints" value.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags = flags;
    let mut list: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and live across the call; `hints` is initialized;
    // `list` is a valid out-pointer, filled only on success and freed below.
    let rc = unsafe { libc::getaddrinfo(c_host.as_ptr(), c_port.as_ptr(), &hints, &mut list) };
    if rc != 0 {
        // SAFETY: gai_strerror returns a pointer to a static NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(libc::gai_strerror(rc)) };
        return Err(msg.to_string_lossy().into_owned());
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getaddrinfo returned, not yet freed.
        let ai = unsafe { &*cur };
        if let Some(addr) = sockaddr_to_std(ai) {
            out.push(addr);
        }
        cur = ai.ai_next;
    }
    // SAFETY: `list` came from a successful getaddrinfo and is freed exactly once.
    unsafe { libc::freeaddrinfo(list) };
    Ok(out)
}

fn sockaddr_to_std(ai: &libc::addrinfo) -> Option<SocketAddr> {
    if ai.ai_addr.is_null() {
        return None;
    }
    let len = ai.ai_addrlen as usize;
    match ai.ai_family {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: family AF_INET with a long enough buffer means ai_addr is a sockaddr_in;
            // read_unaligned copes with any alignment.
            let sa = unsafe { std::ptr::read_unaligned(ai.ai_addr as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let sa = unsafe { std::ptr::read_unaligned(ai.ai_addr as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sa.sin6_addr.s6_addr),
                u16::from_be(sa.sin6_port),
                sa.sin6_flowinfo,
                sa.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Exponential backoff with ±50 % jitter, so ranks started together do not retry in lockstep.
struct Backoff {
    next: Duration,
    rng: u64,
}

impl Backoff {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Backoff {
            next: BACKOFF_INITIAL,
            // Any non-zero seed works for xorshift; mix in the pid so ranks differ.
            rng: (nanos ^ (u64::from(std::process::id()) << 32)) | 1,
        }
    }

    fn next_delay(&mut self) -> Duration {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let delay = self.next.mul_f64(0.5 + unit);
        self.next = self.next.mul_f64(BACKOFF_FACTOR).min(BACKOFF_MAX);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::server::StoreServer;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn handshake_bytes() -> Vec<u8> {
        let mut v = hex("00 CEF7853C 0D");
        v.extend_from_slice(&std::process::id().to_le_bytes());
        v
    }

    /// A fake server for one connection: for each step, reads exactly the expected request
    /// bytes, checks them, and writes the canned reply. Returns the unread remainder on EOF.
    fn scripted(steps: Vec<(Vec<u8>, Vec<u8>)>) -> (u16, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            for (i, (expect, reply)) in steps.into_iter().enumerate() {
                let mut got = vec![0u8; expect.len()];
                sock.read_exact(&mut got).unwrap();
                assert_eq!(got, expect, "request {i} differs");
                sock.write_all(&reply).unwrap();
            }
        });
        (port, handle)
    }

    fn opts(timeout_ms: u64) -> ConnectOptions {
        ConnectOptions::with_timeout(Duration::from_millis(timeout_ms))
    }

    fn echo() -> Vec<u8> {
        std::process::id().to_le_bytes().to_vec()
    }

    #[test]
    fn requests_are_byte_identical_to_torch_client_capture() {
        // Bytes as captured from a torch 2.11 client (protocol reference, section 3).
        let steps = vec![
            (handshake_bytes(), echo()),
            (hex("01 0200000000000000 2f6b 0200000000000000 7631"), vec![]),
            (hex("06 0100000000000000 0200000000000000 2f6b"), hex("00")),
            (hex("03 0200000000000000 2f6b"), hex("0200000000000000 7631")),
            (hex("04 0200000000000000 2f6e 0300000000000000"), hex("0300000000000000")),
            (
                hex("05 0200000000000000 0200000000000000 2f6b 0300000000000000 2f7a7a"),
                hex("01"),
            ),
            (
                hex("02 0200000000000000 2f6b 0200000000000000 7631 0200000000000000 7632"),
                hex("0200000000000000 7632"),
            ),
            (hex("09 0200000000000000 2f6b 0100000000000000 2b"), vec![]),
            (
                hex("0b 0200000000000000 0200000000000000 2f61 0100000000000000 31 0200000000000000 2f62 0100000000000000 32"),
                vec![],
            ),
            (
                hex("06 0200000000000000 0200000000000000 2f61 0200000000000000 2f62"),
                hex("00"),
            ),
            (
                hex("0a 0200000000000000 0200000000000000 2f61 0200000000000000 2f62"),
                hex("0100000000000000 31 0100000000000000 32"),
            ),
            (hex("08 0200000000000000 2f61"), hex("0100000000000000")),
            (hex("07"), hex("0400000000000000")),
            (hex("0e 0200000000000000 2f71 0100000000000000 65"), vec![]),
            (hex("10 0200000000000000 2f71"), hex("0100000000000000")),
            (
                hex("0f 0200000000000000 2f71"),
                hex("0100000000000000 0100000000000000 65"),
            ),
            (hex("0f 0200000000000000 2f71"), hex("0000000000000000")),
            (
                hex("11"),
                hex("0300000000000000 0200000000000000 2f61 0500000000000000 696e69742f 0300000000000000 2f7a7a"),
            ),
        ];
        let (port, server) = scripted(steps);
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        let t = Duration::from_secs(5);
        s.set("k", b"v1").unwrap();
        assert_eq!(s.get("k", t).unwrap(), b"v1");
        assert_eq!(s.add("n", 3).unwrap(), 3);
        assert!(!s.check(&["k", "zz"]).unwrap());
        assert_eq!(s.compare_set("k", b"v1", b"v2").unwrap(), b"v2");
        s.append("k", b"+").unwrap();
        s.multi_set(&[("a", b"1".as_slice()), ("b", b"2".as_slice())])
            .unwrap();
        assert_eq!(
            s.multi_get(&["a", "b"], t).unwrap(),
            vec![b"1".to_vec(), b"2".to_vec()]
        );
        assert!(s.delete_key("a").unwrap());
        assert_eq!(s.num_keys().unwrap(), 4);
        s.queue_push("q", b"e").unwrap();
        assert_eq!(s.queue_len("q").unwrap(), 1);
        assert_eq!(s.queue_pop("q", None).unwrap(), Some(b"e".to_vec()));
        assert_eq!(s.queue_pop("q", None).unwrap(), None);
        assert_eq!(s.list().unwrap(), vec!["a".to_owned(), "zz".to_owned()]);
        drop(s);
        server.join().unwrap();
    }

    #[test]
    fn wait_timeout_cancels_and_accepts_late_stop_waiting() {
        for (cancel_reply, late) in [(hex("01"), false), (hex("00 01"), true)] {
            let steps = vec![
                (handshake_bytes(), echo()),
                (hex("06 0100000000000000 0300000000000000 2f7a7a"), vec![]),
                (hex("0c"), cancel_reply),
                (hex("0d").into_iter().chain(echo()).collect(), echo()),
            ];
            let (port, server) = scripted(steps);
            let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
            let start = Instant::now();
            let result = s.wait(&["zz"], Duration::from_millis(100));
            assert!(start.elapsed() >= Duration::from_millis(100));
            if late {
                // The key arrived just before the cancel: the wait succeeded.
                result.unwrap();
                s.ping().unwrap();
                server.join().unwrap();
                continue;
            }
            let err = result.unwrap_err();
            assert_eq!(err.status, Status::Timeout);
            assert!(
                err.message
                    .starts_with("wait timeout after 100ms, keys: /zz"),
                "{}",
                err.message
            );
            assert!(
                err.message.contains(&format!("127.0.0.1:{port}")),
                "{}",
                err.message
            );
            // The stream is still in step: the next request works.
            s.ping().unwrap();
            server.join().unwrap();
        }
    }

    #[test]
    fn wait_for_workers_sends_add_init_without_prefix() {
        let steps = vec![
            (handshake_bytes(), echo()),
            (
                hex("04 0500000000000000 696e69742f 0100000000000000"),
                hex("0100000000000000"),
            ),
        ];
        let (port, server) = scripted(steps);
        let o = ConnectOptions {
            wait_for_workers: Some(2),
            ..opts(5000)
        };
        let _s = TcpStore::connect("127.0.0.1", port, &o).unwrap();
        server.join().unwrap();
        let err = TcpStore::connect(
            "127.0.0.1",
            port,
            &ConnectOptions {
                wait_for_workers: Some(0),
                ..opts(100)
            },
        )
        .unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
    }

    #[test]
    fn server_closing_breaks_the_connection_and_later_calls_fail_fast() {
        let (port, server) = scripted(vec![(handshake_bytes(), echo())]);
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        server.join().unwrap(); // the fake server has closed the socket
        let err = s.add("n", 1).unwrap_err();
        assert_eq!(err.status, Status::Io, "{err}");
        assert!(
            err.message.contains(&format!("127.0.0.1:{port}")),
            "{}",
            err.message
        );
        assert!(err.message.contains("ADD"), "{}", err.message);
        let start = Instant::now();
        let err = s.num_keys().unwrap_err();
        assert_eq!(err.status, Status::InvalidState, "{err}");
        assert!(err.message.contains("reconnect"), "{}", err.message);
        assert!(start.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn a_server_that_stops_answering_does_not_hang_the_client() {
        // The fake server handshakes, then reads the ADD and never replies.
        let add = hex("04 0200000000000000 2f6e 0100000000000000");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; handshake_bytes().len()];
            sock.read_exact(&mut buf).unwrap();
            sock.write_all(&echo()).unwrap();
            let mut buf = vec![0u8; add.len()];
            sock.read_exact(&mut buf).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
        });
        let s = TcpStore::connect("127.0.0.1", port, &opts(200)).unwrap();
        let start = Instant::now();
        let err = s.add("n", 1).unwrap_err();
        let took = start.elapsed();
        assert_eq!(err.status, Status::Io, "{err}");
        assert!(err.message.contains("no reply"), "{}", err.message);
        assert!(
            took >= MIN_REPLY_TIMEOUT && took < MIN_REPLY_TIMEOUT * 3,
            "{took:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn limits_are_refused_before_sending_and_keep_the_connection() {
        let (port, server) = scripted(vec![
            (handshake_bytes(), echo()),
            (hex("07"), hex("0000000000000000")),
        ]);
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        let long_key = "k".repeat(wire::MAX_KEY_LEN); // plus "/" is one byte over
        let err = s.set(&long_key, b"v").unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        let big = vec![0u8; wire::MAX_VALUE_LEN + 1];
        assert_eq!(
            s.set("k", &big).unwrap_err().status,
            Status::InvalidArgument
        );
        assert_eq!(
            s.get(&long_key, Duration::from_secs(1)).unwrap_err().status,
            Status::InvalidArgument
        );
        assert_eq!(s.num_keys().unwrap(), 0);
        server.join().unwrap();
    }

    #[test]
    fn connect_retries_until_the_server_appears_and_times_out_otherwise() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let start = Instant::now();
        let err = TcpStore::connect("127.0.0.1", port, &opts(300)).unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
        assert!(
            err.message.contains(&format!("(127.0.0.1, {port})")),
            "{}",
            err.message
        );
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert!(start.elapsed() < Duration::from_secs(3));

        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let server = StoreServer::bind("127.0.0.1", port).unwrap();
            std::thread::sleep(Duration::from_millis(1000));
            server.shutdown();
        });
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        s.ping().unwrap();
        drop(s);
        late.join().unwrap();
    }

    #[test]
    fn a_wrong_ping_echo_is_retried_on_a_new_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for echo_ok in [false, true] {
                let (mut sock, _) = listener.accept().unwrap();
                let mut buf = vec![0u8; handshake_bytes().len()];
                sock.read_exact(&mut buf).unwrap();
                let nonce = std::process::id().wrapping_add(u32::from(!echo_ok));
                sock.write_all(&nonce.to_le_bytes()).unwrap();
                if echo_ok {
                    let mut b = [0u8; 1];
                    sock.read_exact(&mut b).unwrap();
                    sock.write_all(&0i64.to_le_bytes()).unwrap();
                }
            }
        });
        let s = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
        assert_eq!(s.num_keys().unwrap(), 0);
        server.join().unwrap();
    }

    #[test]
    fn resolves_localhost_ipv6_mapped_first() {
        let addrs = resolve("127.0.0.1", 80).unwrap();
        assert_eq!(addrs.last().unwrap(), &"127.0.0.1:80".parse().unwrap());
        if addrs.len() == 2 {
            assert_eq!(addrs[0], "[::ffff:127.0.0.1]:80".parse().unwrap());
        }
        assert!(resolve("no-such-host.invalid", 80).is_err());
    }

    #[test]
    fn backoff_starts_short_grows_and_is_capped() {
        let mut b = Backoff::new();
        let first = b.next_delay();
        assert!(
            first >= BACKOFF_INITIAL / 2 && first <= BACKOFF_INITIAL * 3 / 2,
            "{first:?}"
        );
        for _ in 0..50 {
            assert!(b.next_delay() <= BACKOFF_MAX * 3 / 2);
        }
    }

    #[test]
    fn against_the_embedded_server() {
        let server = StoreServer::bind("127.0.0.1", 0).unwrap();
        let o = ConnectOptions {
            wait_for_workers: Some(1),
            ..opts(5000)
        };
        let s = std::sync::Arc::new(TcpStore::connect("127.0.0.1", server.port(), &o).unwrap());
        let t = Duration::from_secs(5);
        s.set("bin", b"\x00\xff").unwrap();
        assert_eq!(s.get("bin", t).unwrap(), b"\x00\xff");
        assert_eq!(s.add("n", 5).unwrap(), 5);
        assert_eq!(s.get("n", t).unwrap(), b"5");
        assert_eq!(s.compare_set("m", b"e", b"v").unwrap(), b"e");
        assert!(!s.check(&["m"]).unwrap());
        let mut keys = s.list().unwrap();
        keys.sort();
        assert_eq!(keys, vec!["bin".to_owned(), "n".to_owned()]);
        assert_eq!(s.num_keys().unwrap(), 3); // init/ counts
        let big = vec![7u8; wire::MAX_VALUE_LEN];
        s.set("big", &big).unwrap();
        assert_eq!(s.get("big", t).unwrap(), big);
        // A WAIT satisfied by another connection.
        let setter = {
            let port = server.port();
            std::thread::spawn(move || {
                let other = TcpStore::connect("127.0.0.1", port, &opts(5000)).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                other.set("late", b"x").unwrap();
            })
        };
        s.wait(&["late"], t).unwrap();
        setter.join().unwrap();
        let err = s.wait(&["never"], Duration::from_millis(20)).unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        s.set_timeout(Duration::from_millis(20));
        assert_eq!(s.default_timeout(), Duration::from_millis(20));
        assert_eq!(
            s.queue_pop("q", Some(Duration::from_millis(20)))
                .unwrap_err()
                .status,
            Status::Timeout
        );
        s.queue_push("q", b"1").unwrap();
        assert_eq!(s.queue_pop("q", Some(t)).unwrap(), Some(b"1".to_vec()));
        assert!(s.peer_addr().unwrap().port() == server.port());
        // Threads share the one connection.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = std::sync::Arc::clone(&s);
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        s.add("c", 1).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(s.add("c", 0).unwrap(), 200);
        server.shutdown();
        let err = s.add("c", 0).unwrap_err();
        assert_eq!(err.status, Status::Io, "{err}");
        s.reconnect().unwrap_err();
    }
}
