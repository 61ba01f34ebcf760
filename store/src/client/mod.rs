//! Client for PyTorch's TCPStore wire protocol, behaving on the wire like torch 2.11's C++ client
//! (docs/PROTOCOL.md §1), so it works against torch's servers (libuv and classic) and ours.
//!
//! - Waits time out with torch's text (`wait timeout after 1000ms, keys: /nokey`); unlike torch,
//!   every reply read is bounded (at least [`MIN_REPLY_TIMEOUT`]): by the call's own timeout when
//!   it takes one (a wait's, so a wait longer than the store timeout is not cut short), else by
//!   the store timeout; a WAIT's reply from when it arrives.
//! - Requests over the server's limits fail with [`Status::InvalidArgument`] before anything is
//!   sent; the connection stays usable.
//! - One connection behind a mutex, one request in flight. After an I/O or protocol error the
//!   connection is broken and later calls fail at once until [`TcpStore::reconnect`].

use crate::error::{Error, Result, Status};
use crate::wire::{self, Prefixed, WAIT_CANCELED, WAIT_STOP_WAITING};
use crate::DEFAULT_TIMEOUT;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// The key every torch store with a world size increments once after connecting (no `/`).
pub const INIT_KEY: &str = "init/";
/// Prefix torch's client puts before every user key.
const KEY_PREFIX: &str = "/";
/// Reply reads never time out faster than this (a store timeout of 0 only means "do not wait").
pub const MIN_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// Size of the reused reply buffer; larger values are read straight into the result.
const READ_BUFFER_SIZE: usize = 64 * 1024;
/// The request buffer is shrunk back after a request larger than this.
const KEEP_OUT_CAPACITY: usize = 1 << 20;
/// At most this many keys are named in a wait-timeout message.
const KEYS_IN_MESSAGE: usize = 16;

/// How [`TcpStore::connect`] connects and how long the store's calls may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Store timeout: the default of the calls that take a timeout, and the bound of the reply
    /// reads of those that do not. Default 300 s.
    pub timeout: Duration,
    /// How long to keep retrying the connection (connect, VALIDATE, PING). Default 300 s.
    pub connect_timeout: Duration,
    /// `Some(world_size)`: send `ADD "init/" 1` after connecting, like a torch store created with
    /// `wait_for_workers=True`.
    pub wait_for_workers: Option<usize>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions::with_timeout(DEFAULT_TIMEOUT)
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

/// What [`TcpStore::connection_state`] sees of the connection without sending a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// Open as far as can be seen.
    Open,
    /// The server closed it, or an earlier error left it unusable: every request would fail.
    Closed,
    /// Another thread's request holds it (a WAIT); nothing can be seen without waiting.
    Busy,
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

/// Reads with a per-reply deadline, set at the reply's first read (each read has `SO_RCVTIMEO`).
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

    /// Encodes one request (nothing is sent when that fails), writes it and starts its reply's
    /// deadline.
    fn request(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Step<()> {
        self.out.clear();
        encode(&mut self.out).map_err(Fail::Invalid)?;
        self.send().map_err(Fail::Io)
    }

    fn send(&mut self) -> io::Result<()> {
        let result = self.stream().write_all(&self.out);
        if self.out.capacity() > KEEP_OUT_CAPACITY {
            self.out = Vec::with_capacity(4096);
        }
        self.reader.get_mut().deadline = None;
        result
    }

    /// Sends `WAIT keys` and waits up to `timeout` for its reply (see [`Conn::finish_wait`]).
    fn wait<'k>(
        &mut self,
        keys: impl IntoIterator<Item = Prefixed<'k>>,
        timeout: Duration,
    ) -> Step<()> {
        self.request(|out| wire::encode_wait(out, keys))?;
        self.finish_wait(timeout)
    }

    /// Waits up to `timeout` for the reply of a WAIT already sent; on timeout cancels it (a late
    /// `00 01` means the keys arrived: success; `01` returns [`Fail::WaitTimeout`]).
    fn finish_wait(&mut self, timeout: Duration) -> Step<()> {
        if self.reader.buffer().is_empty() && !crate::net::poll_readable(self.stream(), timeout)? {
            self.request(bare(wire::encode_cancel_wait))?;
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
        // The wait was the call's timeout's to bound; the reply's own deadline starts now, not
        // when the replies before it (a DELETE_KEY's) were read.
        self.reader.get_mut().deadline = None;
        let got = wire::read_u8(&mut self.reader)?;
        if got != WAIT_STOP_WAITING {
            return Err(Fail::Protocol(format!(
                "WAIT reply was byte {got:#04x}, expected {WAIT_STOP_WAITING:#04x}"
            )));
        }
        Ok(())
    }
}

/// An encoder of a request that cannot exceed a limit.
fn bare(encode: impl FnOnce(&mut Vec<u8>)) -> impl FnOnce(&mut Vec<u8>) -> Result<()> {
    |out| {
        encode(out);
        Ok(())
    }
}

fn user_key(key: &str) -> Prefixed<'_> {
    Prefixed::new(KEY_PREFIX, key)
}

fn user_keys<'k>(keys: &'k [&'k str]) -> impl Iterator<Item = Prefixed<'k>> + 'k {
    keys.iter().map(|k| user_key(k))
}

/// Wire keys joined like torch's timeout message (`/a, /b`), shortened for long lists.
fn describe_keys(keys: &[&str]) -> String {
    let shown: Vec<String> = keys
        .iter()
        .take(KEYS_IN_MESSAGE)
        .map(|k| format!("{KEY_PREFIX}{k}"))
        .collect();
    let mut s = shown.join(", ");
    if keys.len() > KEYS_IN_MESSAGE {
        s.push_str(&format!(", ... ({} more)", keys.len() - KEYS_IN_MESSAGE));
    }
    s
}

impl TcpStore {
    /// Connects to the TCPStore server at `host:port` like torch's client (see [`ConnectOptions`]).
    pub fn connect(host: &str, port: u16, opts: &ConnectOptions) -> Result<TcpStore> {
        if opts.wait_for_workers == Some(0) {
            return Err(Error::invalid(format!(
                "store {host}:{port}: wait_for_workers must be a world size of at least 1 \
                 (use None to not announce this client)"
            )));
        }
        let started = Instant::now();
        let store = TcpStore::open_client(host, port, opts.connect_timeout, opts.timeout)?;
        if opts.wait_for_workers.is_some() {
            store.ask(
                "ADD",
                |out| wire::encode_add(out, INIT_KEY, 1),
                wire::read_i64,
            )?;
        }
        log::info!(
            target: crate::CLIENT_LOG_TARGET,
            "connected to the store at {host}:{port} in {:.1}ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(store)
    }

    fn open_client(
        host: &str,
        port: u16,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<TcpStore> {
        Ok(TcpStore {
            host: host.to_owned(),
            port,
            connect_timeout,
            timeout_ns: AtomicU64::new(duration_ns(timeout)),
            conn: Mutex::new(open(host, port, connect_timeout, timeout)?),
        })
    }

    /// Replaces the connection with a new one (no `ADD "init/"`), e.g. after an error.
    pub fn reconnect(&self) -> Result<()> {
        let fresh = open(&self.host, self.port, self.connect_timeout, self.timeout())?;
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
        // The new connection is clean even if a panic poisoned the lock of the old one.
        self.conn.clear_poison();
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

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
        self.call("PING", &[], None, |c| {
            c.request(bare(|out| wire::encode_ping(out, nonce)))?;
            match wire::read_u32(&mut c.reader)? {
                echoed if echoed == nonce => Ok(()),
                echoed => Err(Fail::Protocol(format!(
                    "PING echoed {echoed}, expected {nonce}"
                ))),
            }
        })?;
        Ok(start.elapsed())
    }

    /// Appends `value` to the FIFO queue `key` (torch >= 2.8, libuv server only).
    pub fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let encode = |out: &mut Vec<u8>| wire::encode_queue_push(out, &user_key(key), value);
        self.ask("QUEUE_PUSH", encode, |_| Ok(()))
    }

    /// Pops the oldest value of queue `key`. With `Some(timeout)` it first waits (like torch's
    /// `block=True`) until the queue is non-empty; `Ok(None)` means the queue was empty.
    pub fn queue_pop(&self, key: &str, wait: Option<Duration>) -> Result<Option<Vec<u8>>> {
        self.call("QUEUE_POP", &[key], wait, |c| {
            if let Some(timeout) = wait {
                c.wait(std::iter::once(user_key(key)), timeout)?;
            }
            c.request(|out| wire::encode_queue_pop(out, &user_key(key)))?;
            Ok(wire::read_queue_pop(&mut c.reader)?)
        })
    }

    /// Number of values in queue `key` (0 when there is no such queue).
    pub fn queue_len(&self, key: &str) -> Result<i64> {
        let encode = |out: &mut Vec<u8>| wire::encode_queue_len(out, &user_key(key));
        self.ask("QUEUE_LEN", encode, wire::read_i64)
    }

    /// The user keys in the store (torch >= 2.10), like torch's `list_keys()` (keys without the
    /// `/` prefix, such as `init/`, are left out; non-UTF-8 keys are converted lossily).
    pub fn list(&self) -> Result<Vec<String>> {
        let keys = self.ask("LIST", bare(wire::encode_list), wire::read_list)?;
        Ok(keys
            .iter()
            .filter_map(|k| k.strip_prefix(KEY_PREFIX.as_bytes()))
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect())
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn connection(&self) -> MutexGuard<'_, Conn> {
        // A panic while holding the lock could have left a request half written.
        self.conn.lock().unwrap_or_else(|poisoned| {
            let mut conn = poisoned.into_inner();
            conn.broken
                .get_or_insert_with(|| "a thread panicked during a request".to_owned());
            conn
        })
    }

    fn ask<T>(
        &self,
        op: &'static str,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<()>,
        read: impl FnOnce(&mut BufReader<SocketReader>) -> io::Result<T>,
    ) -> Result<T> {
        self.call(op, &[], None, |c| {
            c.request(encode)?;
            Ok(read(&mut c.reader)?)
        })
    }

    /// Runs one operation on the connection, its replies bounded by `timeout` (the call's own,
    /// else the store timeout); any failure but a clean wait timeout (naming `wait_keys`) or a
    /// refused request marks the connection broken.
    fn call<T>(
        &self,
        op: &'static str,
        wait_keys: &[&str],
        timeout: Option<Duration>,
        body: impl FnOnce(&mut Conn) -> Step<T>,
    ) -> Result<T> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let mut conn = self.connection();
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

/// The operations of `c10d::Store`, on user keys (torch's client puts `/` before each).
impl TcpStore {
    /// Upserts `key`; wakes the waiters of `key`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let encode = |out: &mut Vec<u8>| wire::encode_set(out, &user_key(key), value);
        self.ask("SET", encode, |_| Ok(()))
    }

    /// Waits until `key` exists (at most `timeout`), then returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.call("GET", &[key], Some(timeout), |c| {
            c.wait(std::iter::once(user_key(key)), timeout)?;
            c.request(|out| wire::encode_get(out, &user_key(key)))?;
            Ok(wire::read_blob(&mut c.reader)?)
        })
    }

    /// Adds `delta` to the decimal counter at `key` (missing counts as 0); returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let encode = |out: &mut Vec<u8>| wire::encode_add(out, &user_key(key), delta);
        self.ask("ADD", encode, wire::read_i64)
    }

    /// True when every key exists. Never blocks.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        self.call("CHECK", &[], None, |c| {
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

    /// Blocks until every key exists, or fails with a timeout naming the keys (the connection
    /// stays usable).
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.call("WAIT", keys, Some(timeout), |c| {
            c.wait(user_keys(keys), timeout)
        })
    }

    /// Deletes `key`; true when it existed.
    pub fn delete_key(&self, key: &str) -> Result<bool> {
        let encode = |out: &mut Vec<u8>| wire::encode_delete_key(out, &user_key(key));
        Ok(self.ask("DELETE_KEY", encode, wire::read_i64)? == 1)
    }

    /// Number of keys in the store (internal keys such as `init/` included, as in torch).
    pub fn num_keys(&self) -> Result<i64> {
        self.ask(
            "GETNUMKEYS",
            bare(wire::encode_get_num_keys),
            wire::read_i64,
        )
    }

    /// c10d's compare-and-set, including its "missing key with non-empty expected" rule.
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let encode =
            |out: &mut Vec<u8>| wire::encode_compare_set(out, &user_key(key), expected, desired);
        self.ask("COMPARE_SET", encode, wire::read_blob)
    }

    /// Appends to `key`, creating it when missing.
    pub fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let encode = |out: &mut Vec<u8>| wire::encode_append(out, &user_key(key), value);
        self.ask("APPEND", encode, |_| Ok(()))
    }

    /// Sets several keys in one message.
    pub fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        self.call("MULTI_SET", &[], None, |c| {
            c.request(|out| {
                wire::encode_multi_set(out, pairs.iter().map(|(k, v)| (user_key(k), *v)))
            })
        })
    }

    /// Waits for every key (at most `timeout`), then returns the values in request order.
    pub fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.call("MULTI_GET", keys, Some(timeout), |c| {
            c.wait(user_keys(keys), timeout)?;
            c.request(|out| wire::encode_multi_get(out, user_keys(keys)))?;
            Ok(keys
                .iter()
                .map(|_| wire::read_blob(&mut c.reader))
                .collect::<io::Result<_>>()?)
        })
    }

    /// Deletes every key of `delete` (missing ones are fine), sets `set` when given, then waits
    /// for every key of `wait`, all in one message.
    pub fn update_then_wait(
        &self,
        delete: &[&str],
        set: Option<(&str, &[u8])>,
        wait: &[&str],
        timeout: Duration,
    ) -> Result<()> {
        self.call("DELETE_KEY/SET/WAIT", wait, Some(timeout), |c| {
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

    /// The state of the connection, seen without a request: for teardown, where a request to a
    /// server that has gone would fail.
    pub fn connection_state(&self) -> ConnectionState {
        // A connection busy with another thread's request (a WAIT) is not looked at.
        let Ok(conn) = self.conn.try_lock() else {
            return ConnectionState::Busy;
        };
        if conn.broken.is_some() || crate::net::peer_hung_up(conn.stream()) {
            ConnectionState::Closed
        } else {
            ConnectionState::Open
        }
    }

    /// Another client of the same store on a connection of its own (no `ADD "init/"`), with
    /// this one's timeouts.
    pub fn duplicate(&self) -> Result<TcpStore> {
        TcpStore::open_client(&self.host, self.port, self.connect_timeout, self.timeout())
    }
}

/// First connect retry delay; short because ranks usually start at the same time as the server.
const BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const BACKOFF_FACTOR: f64 = 1.5;
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Connects with retries until `connect_timeout`, then VALIDATE + PING.
fn open(host: &str, port: u16, connect_timeout: Duration, timeout: Duration) -> Result<Conn> {
    let start = Instant::now();
    let deadline = start + connect_timeout;
    let mut backoff = Backoff::new();
    let mut last_error: Option<String> = None;
    let mut attempted = false;
    loop {
        match crate::net::resolve(host, port) {
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
                        // Another kind of server will not turn into a store by waiting.
                        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                            return Err(Error::protocol(format!(
                                "({host}, {port}) at {addr} is not a PyTorch TCPStore server: {e}. \
                                 Check the store address (MASTER_ADDR and MASTER_PORT, or the \
                                 address passed in): another service listens on that port"
                            )));
                        }
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

/// One connection attempt to one address, with the handshake (std connects non-blocking with
/// `poll(POLLOUT)`, as torch does).
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
    conn.send()?;
    let mut echoed = [0u8; 4];
    if let Err(e) = conn.reader.read_exact(&mut echoed) {
        return Err(match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                e.kind(),
                "the server closed the connection without answering the TCPStore handshake",
            ),
            _ => e,
        });
    }
    if u32::from_le_bytes(echoed) != nonce {
        // A TCPStore echoes the nonce: whatever else answered says more in its next bytes.
        let mut head = echoed.to_vec();
        let _ = conn
            .stream()
            .set_read_timeout(Some(Duration::from_millis(100)));
        let mut more = [0u8; 124];
        if let Ok(n) = conn.reader.read(&mut more) {
            head.extend_from_slice(&more[..n]);
        }
        return Err(match what_answered(&head) {
            Some(other) => io::Error::new(io::ErrorKind::InvalidData, other),
            // A store's wrong echo, retried as torch does.
            None => io::Error::other(format!(
                "Ping failed, invalid value returned from server. Expected: {nonce}, Got: {}",
                u32::from_le_bytes(echoed)
            )),
        });
    }
    conn.apply_reply_timeout(reply_timeout)?;
    Ok(conn)
}

/// Names the kind of server whose first reply bytes are `head` (it answered the TCPStore
/// handshake with something else than the echo); `None` for four bytes and nothing else that
/// name no protocol: a TCPStore's wrong echo.
fn what_answered(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let first_line = text.lines().next().unwrap_or("").trim();
    Some(if head.starts_with(b"HTTP/") {
        format!("an HTTP server answered (\"{first_line}\")")
    } else if head.starts_with(b"SSH-") {
        format!("an SSH server answered (\"{first_line}\")")
    } else if head.len() == 4 && !head.starts_with(b"HTTP") {
        return None;
    } else if matches!(head, [0x15 | 0x16, 0x03, ..]) {
        "a TLS server answered (a TLS record instead of the echo)".to_string()
    } else if !first_line.is_empty()
        && head
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
    {
        format!("the server answered text (\"{first_line}\") instead of echoing the handshake")
    } else {
        let hex: Vec<String> = head.iter().take(16).map(|b| format!("{b:02x}")).collect();
        format!(
            "the server answered bytes {} instead of echoing the handshake",
            hex.join(" ")
        )
    })
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
mod tests;
