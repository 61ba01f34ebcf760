//! Embedded TCPStore server, byte-compatible with torch's default (libuv) server.
//!
//! [`StoreServer::bind`] starts one or more threads, each an edge-triggered mio loop
//! (`event_loop`) over its share of the connections. The store (`state`) sits behind one mutex,
//! taken once per batch of requests: socket work runs in parallel, requests apply in order. A
//! misbehaving peer closes only its connection, counted in [`StoreServer::stats`].

mod budget;
mod connection;
mod event_loop;
mod heap;
pub(crate) mod state;

use crate::error::{Error, Result};
use mio::{Poll, Waker};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Tuning for [`StoreServer::bind_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Close connections that have not completed the VALIDATE handshake within this time.
    /// `None` (the default, like torch) lets a silent client sit; it costs one descriptor.
    pub handshake_timeout: Option<Duration>,
    /// Most clients connected at once, within the open-file limit (raised towards this plus
    /// [`FD_RESERVE`]; at least [`MIN_CONNECTIONS`]); see docs/PROTOCOL.md §1.
    pub max_connections: usize,
    /// After handling a request, keep polling without sleeping for this long, sparing a client's
    /// next request the thread wake-up at the price of that much CPU. Zero disables.
    pub busy_poll: Duration,
    /// Bytes that replies may hold beyond the stored data, across all connections (the reply
    /// budget of docs/PROTOCOL.md §1).
    pub reply_budget: usize,
    /// Bytes that requests not yet answered (WAIT registrations, partly read requests) may hold
    /// across all connections (the pending budget of docs/PROTOCOL.md §1).
    pub pending_budget: usize,
    /// The most of the pending budget one connection may hold; a request that would take it
    /// further closes the connection.
    pub pending_per_client: usize,
    /// Event-loop threads; 0 picks [`default_threads`]. The default is one (a server embedded in
    /// a process that does other work); a dedicated server (`nvfipc serve`) picks
    /// [`default_threads`].
    pub threads: usize,
}

/// Locks `m`, ignoring poisoning: every holder of the server's locks leaves what they guard
/// consistent between statements (each update is one insert, remove, push or take), so a thread
/// that panicked while holding one left nothing half done.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Event-loop threads when [`ServerOptions::threads`] is 0: one per four cores, one to four.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4)
}

/// Descriptors left to the rest of the process when the limit comes from RLIMIT_NOFILE.
pub const FD_RESERVE: usize = 64;
/// The fewest clients a server takes at once, however low RLIMIT_NOFILE is.
pub const MIN_CONNECTIONS: usize = 16;

/// Default of [`ServerOptions::reply_budget`]: 256 MiB.
pub const DEFAULT_REPLY_BUDGET: usize = 256 << 20;

/// Default of [`ServerOptions::pending_budget`]: 256 MiB.
pub const DEFAULT_PENDING_BUDGET: usize = 256 << 20;
/// Default of [`ServerOptions::pending_per_client`]: 64 MiB (twice what a world barrier's WAIT on
/// 131072 keys holds).
pub const DEFAULT_PENDING_PER_CLIENT: usize = 64 << 20;

/// Default of [`ServerOptions::busy_poll`].
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            handshake_timeout: None,
            max_connections: 16384,
            busy_poll: DEFAULT_BUSY_POLL,
            reply_budget: DEFAULT_REPLY_BUDGET,
            pending_budget: DEFAULT_PENDING_BUDGET,
            pending_per_client: DEFAULT_PENDING_PER_CLIENT,
            threads: 1,
        }
    }
}

/// Counters since the server started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Requests handled (including VALIDATE).
    pub requests: u64,
    /// Connections closed because the peer closed them.
    pub closed_by_peer: u64,
    /// Connections closed for a bad or missing handshake (including the handshake timeout).
    pub closed_handshake: u64,
    /// Connections closed for a malformed or refused request (unknown command, over-limit
    /// field, ADD on a non-number, over a pending limit).
    pub closed_malformed: u64,
    /// Connections closed after a socket error.
    pub closed_io: u64,
    /// Failed accepts (e.g. out of descriptors).
    pub accept_errors: u64,
    /// Clients refused because the server already held its most connections.
    pub refused: u64,
    /// Most clients this server holds at once (see [`ServerOptions::max_connections`]).
    pub max_connections: usize,
    /// Bytes of the reply budget held right now (see [`ServerOptions::reply_budget`]).
    pub reply_bytes_held: usize,
    /// Bytes of the pending budget held right now (see [`ServerOptions::pending_budget`]).
    pub pending_bytes_held: usize,
    /// The most recent of those problems, in words.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    requests: AtomicU64,
    closed_by_peer: AtomicU64,
    closed_handshake: AtomicU64,
    closed_malformed: AtomicU64,
    closed_io: AtomicU64,
    accept_errors: AtomicU64,
    refused: AtomicU64,
}

/// State shared between the handle and the server threads.
struct Shared {
    stop: AtomicBool,
    running: AtomicBool,
    connected: AtomicUsize,
    /// Most connections at once, from the options and RLIMIT_NOFILE.
    max_connections: usize,
    stats: Counters,
    last_error: Mutex<Option<String>>,
    /// The store, taken by a loop once per batch of requests.
    state: Mutex<state::StoreState>,
    /// What replies hold beyond the stored data, across every connection.
    budget: Arc<state::Budget>,
    /// What requests not yet answered hold, per connection and across every one.
    pending: state::PendingLimits,
    /// One per event-loop thread, in thread order.
    shards: Vec<event_loop::Shard>,
}

impl Shared {
    fn record_error(&self, message: String) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(message);
        }
    }

    fn stop_all(&self) {
        self.stop.store(true, Ordering::Release);
        for shard in &self.shards {
            if let Err(e) = shard.waker.wake() {
                self.record_error(format!("store server: cannot wake a thread to stop: {e}"));
            }
        }
    }
}

/// Runs when a loop's thread ends, however it ends: stops the other loops (rather than leave
/// connections unserved) and, for the first loop (the listener's), marks the server stopped.
struct LoopExit {
    shared: Arc<Shared>,
    first: bool,
}

impl Drop for LoopExit {
    fn drop(&mut self) {
        self.shared.stop_all();
        if self.first {
            self.shared.running.store(false, Ordering::Release);
        }
    }
}

/// A running TCPStore server. Dropping it stops it.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl StoreServer {
    /// Listens on `host:port` (port 0 picks a free port) with default options. `""` and `"::"`
    /// listen on every IPv6 and IPv4 address (0.0.0.0 without IPv6).
    pub fn bind(host: &str, port: u16) -> Result<StoreServer> {
        Self::bind_with(host, port, &ServerOptions::default())
    }

    /// [`StoreServer::bind`] with explicit options.
    pub fn bind_with(host: &str, port: u16, opts: &ServerOptions) -> Result<StoreServer> {
        let wanted = opts.max_connections.max(MIN_CONNECTIONS);
        let soft = crate::net::raise_fd_limit((wanted + FD_RESERVE) as u64);
        let max_connections = usize::try_from(soft)
            .unwrap_or(usize::MAX)
            .saturating_sub(FD_RESERVE)
            .clamp(MIN_CONNECTIONS, wanted);
        let std_listener = crate::net::bind_listener(host, port)?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| Error::from_io("store server: local_addr", &e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::from_io("store server: set_nonblocking", &e))?;
        let listener = mio::net::TcpListener::from_std(std_listener);
        let threads = if opts.threads == 0 {
            default_threads()
        } else {
            opts.threads
        };
        let mut polls = Vec::with_capacity(threads);
        let mut shards = Vec::with_capacity(threads);
        for _ in 0..threads {
            let poll = Poll::new().map_err(|e| Error::from_io("store server: epoll_create", &e))?;
            let waker = Waker::new(poll.registry(), event_loop::WAKER)
                .map_err(|e| Error::from_io("store server: eventfd", &e))?;
            shards.push(event_loop::Shard::new(waker));
            polls.push(poll);
        }
        let pending = state::PendingLimits {
            budget: state::Budget::new(opts.pending_budget),
            per_client: opts.pending_per_client,
        };
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            running: AtomicBool::new(false),
            connected: AtomicUsize::new(0),
            max_connections,
            stats: Counters::default(),
            last_error: Mutex::new(None),
            state: Mutex::new(state::StoreState::new(pending.clone())),
            budget: state::Budget::new(opts.reply_budget),
            pending,
            shards,
        });
        let mut loops = Vec::with_capacity(threads);
        let mut listener = Some(listener);
        for (index, poll) in polls.into_iter().enumerate() {
            let event_loop =
                event_loop::EventLoop::new(index, poll, listener.take(), shared.clone(), opts)
                    .map_err(|e| Error::from_io("store server: register listener", &e))?;
            loops.push(event_loop);
        }
        shared.running.store(true, Ordering::Release);
        log::info!(
            target: crate::SERVER_LOG_TARGET,
            "store server listening on {addr} ({threads} event loop(s), at most {max_connections} \
             clients)"
        );
        if max_connections < wanted {
            // INFO: common in containers; refusing a client is the event loop's WARN.
            log::info!(
                target: crate::SERVER_LOG_TARGET,
                "store server on {addr}: the open-file limit allows {max_connections} clients, \
                 not the {wanted} asked for; raise `ulimit -n` for more"
            );
        }
        let mut handles = Vec::with_capacity(threads);
        for event_loop in loops {
            let index = event_loop.index;
            let exit = LoopExit {
                shared: shared.clone(),
                first: index == 0,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("nvfipc-store-{}-{index}", addr.port()))
                .spawn(move || {
                    let _exit = exit;
                    event_loop.run();
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    shared.stop_all();
                    for handle in handles {
                        let _ = handle.join();
                    }
                    shared.running.store(false, Ordering::Release);
                    return Err(Error::from_io("store server: cannot start its threads", &e));
                }
            }
        }
        Ok(StoreServer {
            addr,
            shared,
            threads: Mutex::new(handles),
        })
    }

    /// The port actually listened on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address listened on (`[::]:port` for the dual-stack default); an error once the
    /// server has stopped.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        if !self.is_running() {
            return Err(Error::state(format!(
                "store server that listened on {} has stopped",
                self.addr
            )));
        }
        Ok(self.addr)
    }

    /// Clients connected right now (handshake done or not).
    pub fn connected_clients(&self) -> usize {
        if !self.is_running() {
            return 0;
        }
        self.shared.connected.load(Ordering::Acquire)
    }

    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.stats;
        ServerStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            closed_by_peer: c.closed_by_peer.load(Ordering::Relaxed),
            closed_handshake: c.closed_handshake.load(Ordering::Relaxed),
            closed_malformed: c.closed_malformed.load(Ordering::Relaxed),
            closed_io: c.closed_io.load(Ordering::Relaxed),
            accept_errors: c.accept_errors.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            max_connections: self.shared.max_connections,
            reply_bytes_held: self.shared.budget.used(),
            pending_bytes_held: self.shared.pending.budget.used(),
            last_error: self.shared.last_error.lock().ok().and_then(|e| e.clone()),
        }
    }

    /// Stops serving, closes every connection and joins the threads. Idempotent.
    pub fn shutdown(&self) {
        self.shared.stop_all();
        let handles = self
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for handle in handles {
            if handle.join().is_err() {
                self.shared
                    .record_error("store server: a thread panicked".to_string());
            }
        }
    }

    /// Event-loop threads serving (fixed when the server starts).
    pub fn threads(&self) -> usize {
        self.shared.shards.len()
    }

    /// Waits until no client is connected (at most `timeout`, else a timeout error), then stops.
    pub fn shutdown_when_idle(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let connected = self.connected_clients();
            if connected == 0 || !self.is_running() {
                self.shutdown();
                return Ok(());
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                self.shutdown();
                return Err(Error::timeout(format!(
                    "store server on port {}: {connected} client(s) still connected after \
                     waiting {timeout:?} for them to leave; stopped anyway",
                    self.port()
                )));
            }
            std::thread::sleep((timeout - elapsed).min(Duration::from_millis(5)));
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .field("connected", &self.connected_clients())
            .field("running", &self.is_running())
            .finish()
    }
}
