//! A rank that closes after its peers have left (with them the store's host) makes no store
//! request, prints nothing and returns OK at once: rank 0 hosts the store, exchanges with rank 1
//! and exits; then rank 1 frees its cache and its context. Over the library's own TCP client,
//! and over a host store through callbacks whose calls print to stderr when they fail, as
//! `c10d::TCPStore` does. Also in a star of three ranks, where ranks 1 and 2 exchange with rank 0
//! only and so never see each other leave: each closes quietly once rank 0 (the store's host) has
//! left. Every rank is a process (this test binary started again).
//!
//! And the other way round: a rank 0 whose process runs the store's server (as nvFuser's rank 0
//! runs its `c10d::TCPStore`) and closes first keeps its process, and so the server, until the
//! others have closed: their last requests are not cut off by its exit.
//!
//! And random teardowns in that layout: seeded world sizes, topologies, delays and ways of
//! leaving (closing or dropping the cache and the context), every one quiet
//! (`NVFIPC_QUIET_SEEDS`, e.g. `1-200`, widens the run).

use nvfuser_ipc::ffi::store_callbacks::{nvfipc_store_callbacks, CallbackStore};
use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::{Liveness, Store};
use nvfuser_ipc::{Context, ContextOptions};
use nvfuser_ipc::{Error, MemKind, Request};
use nvfuser_ipc::{Result, Status};
use std::ffi::{c_char, c_int, c_void};
use std::io::{BufRead, Write};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{free_port, rerun_args, seeds_from_env, Rng};

const ROLE_VAR: &str = "NVFIPC_QUIET_TEST_ROLE";
const PORT_VAR: &str = "NVFIPC_QUIET_TEST_PORT";
const WORLD_VAR: &str = "NVFIPC_QUIET_TEST_WORLD";
/// Far longer than the harness waits for a rank: a rank that waited on a timeout is killed.
const TIMEOUT: Duration = Duration::from_secs(120);
/// How long the harness lets a rank run.
const LIMIT: Duration = Duration::from_secs(40);
const AFTER: &str = "store calls after rank 0 left: ";

// ------------------------------------------------------------------------------------------------
// The harness
// ------------------------------------------------------------------------------------------------

fn spawn(role: &str, port: u16, world: usize, debug: bool) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(rerun_args("rank_process"))
        .env(ROLE_VAR, role)
        .env(PORT_VAR, port.to_string())
        .env(WORLD_VAR, world.to_string())
        .env_remove("NVFIPC_DEBUG_FILE")
        .env_remove("NVFIPC_DEBUG_SUBSYS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if debug {
        cmd.env("NVFIPC_DEBUG", "DEBUG");
    } else {
        cmd.env_remove("NVFIPC_DEBUG");
    }
    cmd.spawn().expect("spawn a rank process")
}

/// Waits for `child`, killing it past [`LIMIT`].
fn finish(mut child: Child) -> Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The lines that must not appear in a rank's stderr when it leaves normally.
const NOISE: [&str; 4] = [" NVFIPC WARN ", " NVFIPC ERROR ", "[c10d]", "panicked"];

/// Asserts that `out` (of the rank `who` names) printed none of [`NOISE`].
fn assert_quiet(who: &str, out: &Output) {
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        for bad in NOISE {
            assert!(!line.contains(bad), "{who} printed {bad:?}:\n{}", text(out));
        }
    }
}

/// Rank 0 exits after the exchanges; once it is gone (and reaped), ranks 1, 2, ... close one
/// after the other, each while the later ones are still there.
fn run(store_kind: &str, world: usize) {
    let port = free_port();
    let rank0 = spawn(&format!("{store_kind}:0"), port, world, false);
    let others: Vec<Child> = (1..world)
        .map(|r| spawn(&format!("{store_kind}:{r}"), port, world, true))
        .collect();
    let out0 = finish(rank0);
    assert!(out0.status.success(), "rank 0:\n{}", text(&out0));
    // Rank 0 is reaped: its pid names no process any more. Now the others may close, all at
    // once (a rank's cache waits for the peers it exchanged with to close theirs).
    let others: Vec<Child> = others
        .into_iter()
        .map(|mut rank| {
            let mut stdin = rank.stdin.take().unwrap();
            let _ = writeln!(stdin, "rank 0 has left");
            rank
        })
        .collect();
    for (i, rank) in others.into_iter().enumerate() {
        check_quiet(store_kind, i + 1, &finish(rank));
    }
}

/// `out` is the output of a rank that closed after rank 0 left: no store request, nothing
/// printed but debug lines, OK, and debug lines that say what was skipped and why.
fn check_quiet(store_kind: &str, rank: usize, out: &Output) {
    let all = text(out);
    assert!(out.status.success(), "rank {rank}:\n{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{AFTER}0\n")),
        "rank {rank}:\n{all}"
    );
    assert!(stdout.contains("closed: Ok"), "rank {rank}:\n{all}");
    assert_quiet(&format!("rank {rank}"), out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The cache and the context say (at debug level) what they skipped and why: the TCP client
    // sees its server hang up; a store through callbacks cannot, and the peers' boards tell.
    let why = match store_kind {
        "tcp" => "the store's server has gone (it closed the connection",
        "addressed" => "no longer listens on this machine",
        _ => "rank 0 (pid",
    };
    for skipped in [
        "without store traffic (consumed",
        "closes without store traffic",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(" NVFIPC DEBUG ") && l.contains(skipped) && l.contains(why)),
            "rank {rank} did not log skipping ({skipped}, {why}):\n{all}"
        );
    }
}

#[test]
fn a_rank_closing_after_the_store_host_left_is_quiet_over_the_tcp_client() {
    run("tcp", 2);
}

#[test]
fn a_rank_closing_after_the_store_host_left_is_quiet_over_a_callback_store() {
    run("callbacks", 2);
}

/// Ranks 1 and 2 exchange with rank 0 only: rank 1 closes while rank 2 is still there and has
/// never been seen by it, so only rank 0's departure can tell it that the store went with rank 0.
#[test]
fn ranks_of_a_star_closing_after_the_store_host_left_are_quiet_over_a_callback_store() {
    run("callbacks", 3);
}

/// A chain 0 - 1 - 2 - 3 over a callback store told where its server listens (as the c10d
/// adapter tells it for a `c10d::TCPStore`): ranks 2 and 3 never exchange with rank 0, so no
/// board tells them that it left; the server no longer listening does.
#[test]
fn ranks_that_never_saw_the_store_host_are_quiet_over_an_addressed_callback_store() {
    run("addressed", 4);
}

/// A chain 0 - 1 - 2 over a callback store whose server runs in rank 0's process. Rank 0 closes
/// its cache and its context first, then would exit; the others close their caches, and only
/// later their contexts. Rank 0 must still be there when they do (it waits for them), and their
/// closing requests must all succeed.
#[test]
fn the_rank_serving_the_store_stays_until_the_others_have_closed() {
    let world = 3;
    let port = free_port();
    let mut rank0 = spawn("serving:0", port, world, false);
    let mut others: Vec<Child> = (1..world)
        .map(|r| spawn(&format!("serving:{r}"), port, world, false))
        .collect();
    let tell = |rank: &mut Child, what: &str| {
        let stdin = rank.stdin.as_mut().unwrap();
        writeln!(stdin, "{what}").unwrap();
        stdin.flush().unwrap();
    };
    for rank in &mut others {
        tell(rank, "close your cache");
    }
    // Rank 0's cache is closed once rank 1's is; its context waits for the others' contexts.
    std::thread::sleep(Duration::from_millis(1500));
    let early = rank0.try_wait().unwrap();
    for rank in &mut others {
        tell(rank, "close your context");
    }
    let outs: Vec<Output> = others.into_iter().map(finish).collect();
    let out0 = finish(rank0);
    assert!(
        early.is_none(),
        "rank 0 exited ({early:?}) before the others closed their contexts:\n{}",
        text(&out0)
    );
    assert!(out0.status.success(), "rank 0:\n{}", text(&out0));
    assert!(
        String::from_utf8_lossy(&out0.stdout).contains("context closed: Ok(())"),
        "rank 0:\n{}",
        text(&out0)
    );
    for (i, out) in outs.iter().enumerate() {
        let all = text(out);
        assert!(out.status.success(), "rank {}:\n{all}", i + 1);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("closed: Ok"), "rank {}:\n{all}", i + 1);
        // They talked to the store as they closed (it was there), and nothing failed.
        let calls: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix(AFTER))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(calls > 0, "rank {} made no store request:\n{all}", i + 1);
        assert_quiet(&format!("rank {}", i + 1), out);
    }
}

/// The delays a rank of `random_teardowns_are_quiet` waits before freeing its cache, and its
/// context (ms).
const DELAYS_MS: [u64; 8] = [0, 0, 1, 2, 5, 20, 100, 250];

/// How a rank of `random_teardowns_are_quiet` leaves: closing its cache and context, dropping
/// them (as a C++ destructor frees them), or exiting without either (a process that ends on an
/// error or `os._exit`; its peers see it exit).
const LEAVE: [&str; 3] = ["close", "drop", "exit"];

/// The stores of `random_teardowns_are_quiet`, both served by rank 0's process: through
/// callbacks told where the server listens (nvFuser over the c10d adapter), or the library's own
/// TCP client. A store through callbacks that cannot tell is left out: there a rank that never
/// exchanged with rank 0 cannot see it leave (`nvfipc_context_free` says so; the other tests of
/// this file cover what such a store promises).
const STORES: [&str; 2] = ["addressed", "tcp"];

/// Teardowns as nvFuser's test processes end them, drawn at random: rank 0's process runs the
/// store's server (one of [`STORES`]), the ranks exchange over a chain, a star or a ring, wait
/// until everyone has, and then each leaves in one of the [`LEAVE`] ways after delays of its own,
/// and exits at once: rank 0 first, last or between. The harness reaps the ranks in order, so an
/// exited rank may stay a zombie a while. Every rank must exit 0, close Ok and print nothing but
/// debug lines.
///
/// The first six seeds run by default hold both failures found so far: seed 1 failed (4 runs of
/// 4) before the serving rank waited for the others' close, seeds 2 and 5 before an exited rank
/// that is not reaped yet (a zombie) counted as exited.
#[test]
fn random_teardowns_are_quiet() {
    for seed in seeds_from_env("NVFIPC_QUIET_SEEDS", (1..=6).collect()) {
        check_teardown(seed);
    }
}

fn check_teardown(seed: u64) {
    let mut rng = Rng::new(seed);
    let world = 2 + rng.below(3) as usize;
    let topology = rng.pick(&["chain", "star", "ring"]);
    let flavour = rng.pick(&STORES);
    let port = free_port();
    let roles: Vec<String> = (0..world)
        .map(|r| {
            // Mostly near-simultaneous (the races of a job's end), sometimes far apart.
            let (cache_ms, ctx_ms) = (rng.pick(&DELAYS_MS), rng.pick(&DELAYS_MS));
            // Rank 0 takes the store's server with it: it always frees what it has.
            let ways: &[&str] = if r == 0 { &["close", "drop"] } else { &LEAVE };
            let how = rng.pick(ways);
            format!("random:{r}:{flavour}:{topology}:{cache_ms}:{ctx_ms}:{how}")
        })
        .collect();
    let ranks: Vec<Child> = roles
        .iter()
        .map(|role| spawn(role, port, world, false))
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(finish).collect();
    for (rank, out) in outs.iter().enumerate() {
        let all = text(out);
        let context = format!(
            "seed {seed} (re-run: NVFIPC_QUIET_SEEDS={seed}), roles {roles:?}, rank {rank}"
        );
        assert!(out.status.success(), "{context}:\n{all}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("left: Ok"),
            "{context}:\n{all}"
        );
        assert_quiet(&context, out);
    }
}

// ------------------------------------------------------------------------------------------------
// The rank processes
// ------------------------------------------------------------------------------------------------

/// Counts the requests made through it once armed (the collector's own connection included).
struct Counting {
    inner: Arc<dyn Store>,
    armed: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
}

impl Counting {
    fn count(&self) {
        if self.armed.load(Ordering::SeqCst) {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Store for Counting {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.count();
        self.inner.set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.count();
        self.inner.get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.count();
        self.inner.add(key, delta)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.count();
        self.inner.check(keys)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.count();
        self.inner.wait(keys, timeout)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.count();
        self.inner.delete_key(key)
    }
    fn num_keys(&self) -> Result<i64> {
        self.count();
        self.inner.num_keys()
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.count();
        self.inner.compare_set(key, expected, desired)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.count();
        self.inner.append(key, value)
    }
    fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        self.count();
        self.inner.multi_set(pairs)
    }
    fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.count();
        self.inner.multi_get(keys, timeout)
    }
    fn default_timeout(&self) -> Duration {
        self.inner.default_timeout()
    }
    fn liveness(&self) -> Liveness {
        self.inner.liveness()
    }
    fn separate_connection(&self) -> Option<Arc<dyn Store>> {
        let inner = self.inner.separate_connection()?;
        Some(Arc::new(Counting {
            inner,
            armed: self.armed.clone(),
            calls: self.calls.clone(),
        }))
    }
}

// ---- a host store through callbacks that prints when a call fails, as c10d does ---------------

/// The callbacks' context: a TCP client of the store.
struct Host {
    tcp: TcpStore,
}

fn host<'a>(ctx: *mut c_void) -> &'a Host {
    // SAFETY: `ctx` is the `Host` leaked by `callback_store`, alive for the whole process.
    unsafe { &*(ctx as *const Host) }
}

/// The key the library passed (`len` bytes, not NUL-terminated).
fn key_of<'a>(key: *const c_char, len: usize) -> &'a str {
    // SAFETY: the library passes `len` valid bytes of a UTF-8 key, alive during the call.
    let bytes = unsafe { std::slice::from_raw_parts(key.cast::<u8>(), len) };
    std::str::from_utf8(bytes).unwrap()
}

fn keys_of<'a>(keys: *const *const c_char, lens: *const usize, n: usize) -> Vec<&'a str> {
    // SAFETY: the library passes `n` key pointers and lengths, alive during the call.
    let (keys, lens) = unsafe {
        (
            std::slice::from_raw_parts(keys, n),
            std::slice::from_raw_parts(lens, n),
        )
    };
    keys.iter().zip(lens).map(|(&k, &l)| key_of(k, l)).collect()
}

/// Prints a failure as c10d does (with the text the test looks for), and returns its code.
fn report<T>(op: &str, r: Result<T, impl Into<Error>>, ok: impl FnOnce(T)) -> c_int {
    match r.map_err(Into::into) {
        Ok(v) => {
            ok(v);
            0
        }
        Err(e) => {
            eprintln!("[c10d] WARNING {op} failed: {e}. Did the remote server shutdown or crash?");
            if e.status == Status::Timeout {
                2
            } else {
                1
            }
        }
    }
}

fn ms(timeout_ms: i64) -> Duration {
    Duration::from_millis(timeout_ms.max(0) as u64)
}

unsafe extern "C" fn cb_set(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> c_int {
    // SAFETY: the library passes `value_len` valid bytes, alive during the call.
    let value = unsafe { std::slice::from_raw_parts(value, value_len) };
    report(
        "set",
        host(ctx).tcp.set(key_of(key, key_len), value),
        |()| {},
    )
}

unsafe extern "C" fn cb_get(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    timeout_ms: i64,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> c_int {
    let got = host(ctx).tcp.get(key_of(key, key_len), ms(timeout_ms));
    report("get", got, |v| {
        // SAFETY: malloc'd for the library, which frees it with `free`; the outputs are valid.
        unsafe {
            let p = libc::malloc(v.len().max(1)).cast::<u8>();
            std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len());
            *out_value = p;
            *out_len = v.len();
        }
    })
}

unsafe extern "C" fn cb_add(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    delta: i64,
    out_value: *mut i64,
) -> c_int {
    let r = host(ctx).tcp.add(key_of(key, key_len), delta);
    // SAFETY: the output pointer is valid during the call.
    report("add", r, |v| unsafe { *out_value = v })
}

unsafe extern "C" fn cb_check(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    n: usize,
    out_ready: *mut bool,
) -> c_int {
    let r = host(ctx).tcp.check(&keys_of(keys, key_lens, n));
    // SAFETY: the output pointer is valid during the call.
    report("check", r, |v| unsafe { *out_ready = v })
}

unsafe extern "C" fn cb_delete(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    out_deleted: *mut bool,
) -> c_int {
    let r = host(ctx).tcp.delete_key(key_of(key, key_len));
    // SAFETY: the output pointer is valid during the call.
    report("deleteKey", r, |v| unsafe { *out_deleted = v })
}

unsafe extern "C" fn cb_wait(
    ctx: *mut c_void,
    keys: *const *const c_char,
    key_lens: *const usize,
    n: usize,
    timeout_ms: i64,
) -> c_int {
    let keys = keys_of(keys, key_lens, n);
    report("wait", host(ctx).tcp.wait(&keys, ms(timeout_ms)), |()| {})
}

fn callback_store(tcp: TcpStore) -> CallbackStore {
    let ctx = Box::into_raw(Box::new(Host { tcp })).cast::<c_void>();
    CallbackStore::new(nvfipc_store_callbacks {
        ctx,
        set: Some(cb_set),
        get: Some(cb_get),
        add: Some(cb_add),
        check: Some(cb_check),
        delete_key: Some(cb_delete),
        wait: Some(cb_wait),
        compare_set: None,
        append: None,
        num_keys: None,
        multi_set: None,
        multi_get: None,
        free_value: None,
        error_message: None,
    })
    .expect("callback store")
    .with_default_timeout(TIMEOUT)
}

/// One rank of the tests above; only does something when a test started it.
#[test]
#[ignore = "a rank process, started by the tests of this file"]
fn rank_process() {
    let role = std::env::var(ROLE_VAR).expect("started without a role");
    let port: u16 = std::env::var(PORT_VAR).unwrap().parse().unwrap();
    // kind:rank[:plan...]
    let parts: Vec<&str> = role.split(':').collect();
    let (kind, rank): (&str, usize) = (parts[0], parts[1].parse().unwrap());
    let _server = (rank == 0).then(|| StoreServer::bind("127.0.0.1", port).expect("host"));
    let tcp = TcpStore::connect("127.0.0.1", port, &ConnectOptions::with_timeout(TIMEOUT))
        .expect("connect to the store");
    // A random teardown draws its store as well.
    let flavour = if kind == "random" { parts[2] } else { kind };
    let inner: Arc<dyn Store> = match flavour {
        "tcp" => Arc::new(tcp),
        "addressed" | "serving" => {
            let store = callback_store(tcp);
            store.set_server_address("127.0.0.1", port);
            Arc::new(store)
        }
        _ => Arc::new(callback_store(tcp)),
    };
    let armed = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let store: Arc<dyn Store> = Arc::new(Counting {
        inner,
        armed: armed.clone(),
        calls: calls.clone(),
    });
    let world: usize = std::env::var(WORLD_VAR).unwrap().parse().unwrap();
    let ctx = Context::new(ContextOptions {
        rank,
        world_size: world,
        local_rank: 0,
        local_world_size: 1,
        store: store.clone(),
    })
    .expect("context");
    let cache = nvfuser_ipc::cache_from_context(&ctx).expect("cache");
    cache.set_timeout(TIMEOUT);
    let buffer = nvfuser_ipc::host_alloc(4096).expect("host buffer");
    // A star: rank 0 exchanges with every other rank, the others with rank 0 only; or a chain
    // (`addressed`): each rank with its neighbours.
    let topology = match kind {
        "addressed" | "serving" => "chain",
        "random" => parts[3],
        _ => "star",
    };
    let peers = peers_of(topology, rank, world);
    let reqs: Vec<Request> = peers
        .iter()
        .flat_map(|&peer| {
            [
                Request::send(peer, "quiet", buffer.addr(), 4096, MemKind::Host),
                Request::recv(peer, "quiet", buffer.addr(), 4096, MemKind::Host),
            ]
        })
        .collect();
    cache.exchange_handles(&reqs).expect("exchange");
    if kind == "random" {
        return leave_after_delays(rank, world, &parts[4..], &*store, ctx, cache);
    }
    if rank == 0 {
        // Wait until the others have done every store call of their exchange.
        for peer in 1..world {
            store
                .get(&format!("quiet/rank{peer}-done"), TIMEOUT)
                .expect("rank done");
        }
        if kind == "serving" {
            // Close everything, then leave at once: the server goes with this process.
            let cache_closed = cache.try_close().map(|_| ());
            let ctx_closed = ctx.close();
            println!("cache closed: {cache_closed:?}, context closed: {ctx_closed:?}");
            std::io::stdout().flush().unwrap();
        }
        // Without closing anything otherwise: the store goes with this process.
        std::process::exit(0);
    }
    // The collector deletes the record keys this rank read in the background: let it finish.
    let start = std::time::Instant::now();
    while cache.stats().keys_deleted < 2 && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "keys deleted before closing: {}",
        cache.stats().keys_deleted
    );
    store.set(&format!("quiet/rank{rank}-done"), b"1").unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    armed.store(true, Ordering::SeqCst);
    let cache_closed = cache.try_close().map(|_| ());
    if kind == "serving" {
        // The context later, once rank 0 is closing its own.
        std::io::stdin().lock().read_line(&mut line).unwrap();
    }
    let ctx_closed = ctx.close();
    println!("cache closed: {cache_closed:?}, context closed: {ctx_closed:?}");
    assert!(cache_closed.is_ok() && ctx_closed.is_ok());
    println!("closed: Ok");
    drop(store);
    println!("{AFTER}{}", calls.load(Ordering::SeqCst));
}

/// The peers of `rank` in a chain, a star (around rank 0) or a ring of `world` ranks.
fn peers_of(topology: &str, rank: usize, world: usize) -> Vec<usize> {
    let mut peers: Vec<usize> = match topology {
        "chain" => [rank.checked_sub(1), (rank + 1 < world).then_some(rank + 1)]
            .into_iter()
            .flatten()
            .collect(),
        "ring" => vec![(rank + world - 1) % world, (rank + 1) % world],
        _ if rank == 0 => (1..world).collect(),
        _ => vec![0],
    };
    peers.sort_unstable();
    peers.dedup();
    peers.retain(|&p| p != rank);
    peers
}

/// A rank of `random_teardowns_are_quiet` after its exchange: waits until every rank has
/// exchanged, then leaves as `plan` says (`cache_ms:ctx_ms:how`, how one of [`LEAVE`]) and
/// exits at once, with the store's server when it is rank 0.
fn leave_after_delays(
    rank: usize,
    world: usize,
    plan: &[&str],
    store: &dyn Store,
    ctx: Context,
    cache: nvfuser_ipc::HandleCache,
) {
    let ms = |i: usize| Duration::from_millis(plan[i].parse().unwrap());
    store.set(&format!("quiet/rank{rank}-done"), b"1").unwrap();
    for peer in 0..world {
        store
            .get(&format!("quiet/rank{peer}-done"), TIMEOUT)
            .expect("rank done");
    }
    std::thread::sleep(ms(0));
    if plan[2] == "exit" {
        println!("left: Ok (exited without closing)");
    } else if plan[2] == "drop" {
        // As a C++ destructor frees them: nothing to report but what the library logs.
        drop(cache);
        std::thread::sleep(ms(1));
        drop(ctx);
        println!("left: Ok (dropped)");
    } else {
        let cache_closed = cache.try_close().map(|_| ());
        std::thread::sleep(ms(1));
        let ctx_closed = ctx.close();
        println!("cache closed: {cache_closed:?}, context closed: {ctx_closed:?}");
        if cache_closed.is_ok() && ctx_closed.is_ok() {
            println!("left: Ok");
        }
    }
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}
