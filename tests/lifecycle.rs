//! Generated lifecycles across real processes over the host transport: random legal programs,
//! checked against a model after every step.
//!
//! A seed draws one program that every rank agrees on (which ranks talk at each step, under which
//! tags and through which of two caches; where caches are freed and re-created; whether the step
//! ends with writes through the mappings), and each rank draws its own side of it from the seed
//! and its rank (buffer sizes, whether a buffer is carved from a pooled allocation at an offset or
//! allocated alone, how many steps it lives, when idle pools are released like PyTorch's
//! `empty_cache`, the order of its batch). Buffers are freed with random lags, so addresses come
//! back with new buffers behind them.
//!
//! The model, checked after every step: no call of a legal program fails; every byte read through
//! a mapping, copied by a transfer or written by the peer through its mapping is the exporter's
//! current content; every close leaves opens == closes and no live mapping; after the program no
//! file descriptor, thread or `/dev/shm` entry is left. On a failure the test re-runs the seed
//! with shorter programs and prints the seed and the shortest failing prefix of the program.
//!
//! A second mode kills (SIGKILL) or stops (SIGSTOP) one rank at a random step: every other rank
//! ends with an error that names a rank within the timeout, or finishes, and leaks nothing.
//!
//! `NVFIPC_LIFECYCLE_SEEDS` (e.g. `1-40` or `7,9`) and `NVFIPC_LIFECYCLE_STEPS` widen a run.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::tools::barrier::{barrier, BarrierState};
use nvfuser_ipc::HostBuffer;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind, P2pHandles, Request};
use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{seeds_from_env, Rng};

const ROLE: &str = "NVFIPC_LIFECYCLE_CHILD";
/// Seeds whose programs once failed (kept as regression tests); none so far beyond the two
/// lifecycle bugs that `tests/exchange.rs` keeps as scenarios.
const REGRESSION_SEEDS: &[u64] = &[];

// ------------------------------------------------------------------------------------------------
// The program
// ------------------------------------------------------------------------------------------------

/// One communication of a step: `src` sends to `dst` under `tag`.
#[derive(Clone, Debug)]
struct Comm {
    src: usize,
    dst: usize,
    tag: &'static str,
}

/// One agreed step.
#[derive(Clone, Debug)]
enum Step {
    /// A batch on cache `cache` (0 or 1); `put`: after the transfers every sender also writes
    /// into its receiver's buffer through the mapping, and all ranks meet at a world barrier.
    Exchange {
        cache: usize,
        comms: Vec<Comm>,
        put: bool,
    },
    /// All ranks meet at a world barrier, free cache `cache` and create a new one.
    Recreate { cache: usize },
}

fn program(seed: u64, world: usize, steps: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|_| {
            if rng.chance(4) {
                return Step::Recreate {
                    cache: rng.below(2) as usize,
                };
            }
            let n = 1 + rng.below(world as u64 + 1) as usize;
            let comms = (0..n)
                .map(|_| {
                    let src = rng.below(world as u64) as usize;
                    let dst = (src + 1 + rng.below(world as u64 - 1) as usize) % world;
                    Comm {
                        src,
                        dst,
                        tag: rng.pick(&["a", "b", "c"]),
                    }
                })
                .collect();
            Step::Exchange {
                // Mostly the first cache: the second lives beside it with fewer channels.
                cache: usize::from(rng.chance(25)),
                comms,
                put: rng.chance(30),
            }
        })
        .collect()
}

/// The byte at `i` of what the sender of comm `c` of step `step` sends (`salt` 0) or writes into
/// its receiver's buffer (`salt` 1).
fn pattern(seed: u64, step: usize, c: usize, salt: u64, i: u64) -> u8 {
    let base = seed
        .wrapping_mul(31)
        .wrapping_add(step as u64 * 131 + c as u64 * 17 + salt * 7);
    (base.wrapping_add(i.wrapping_mul(7)) % 251) as u8
}

// ------------------------------------------------------------------------------------------------
// A rank's memory: pooled allocations carved into slots, and buffers allocated alone
// ------------------------------------------------------------------------------------------------

const POOL_BYTES: u64 = 256 * 1024;
const SLOTS: u64 = 8;
const SLOT_BYTES: u64 = POOL_BYTES / SLOTS;

struct Pool {
    buf: HostBuffer,
    used: [bool; SLOTS as usize],
}

/// Where a buffer lives.
enum Place {
    Slot {
        pool: usize,
        slot: usize,
    },
    /// Held for its drop, which frees it.
    Alone {
        _buffer: HostBuffer,
    },
}

struct Buffer {
    place: Place,
    addr: u64,
    bytes: u64,
    /// The step after which it is freed.
    until: usize,
}

#[derive(Default)]
struct Memory {
    pools: Vec<Option<Pool>>,
    live: Vec<Buffer>,
}

impl Memory {
    /// A buffer of `bytes` (drawn by the caller), carved from a pool slot at a random offset
    /// when it fits one, else allocated alone.
    fn alloc(&mut self, rng: &mut Rng, bytes: u64, until: usize) -> usize {
        let place = if bytes <= SLOT_BYTES / 2 && rng.chance(70) {
            let free = self.pools.iter().enumerate().find_map(|(p, pool)| {
                let pool = pool.as_ref()?;
                pool.used.iter().position(|u| !u).map(|s| (p, s))
            });
            let (pool, slot) = match free {
                Some(at) => at,
                None => {
                    let buf = nvfuser_ipc::host_alloc(POOL_BYTES).expect("host alloc of a pool");
                    let new = Pool {
                        buf,
                        used: [false; SLOTS as usize],
                    };
                    match self.pools.iter().position(Option::is_none) {
                        Some(p) => {
                            self.pools[p] = Some(new);
                            (p, 0)
                        }
                        None => {
                            self.pools.push(Some(new));
                            (self.pools.len() - 1, 0)
                        }
                    }
                }
            };
            let p = self.pools[pool].as_mut().expect("a live pool");
            p.used[slot] = true;
            let room = SLOT_BYTES - bytes;
            let offset = rng.below(room / 64 + 1) * 64;
            let addr = p.buf.addr() + slot as u64 * SLOT_BYTES + offset;
            (Place::Slot { pool, slot }, addr)
        } else {
            let b = nvfuser_ipc::host_alloc(bytes).expect("host alloc");
            let addr = b.addr();
            (Place::Alone { _buffer: b }, addr)
        };
        self.live.push(Buffer {
            addr: place.1,
            place: place.0,
            bytes,
            until,
        });
        self.live.len() - 1
    }

    fn write(&self, i: usize, f: impl Fn(u64) -> u8) {
        let b = &self.live[i];
        let data: Vec<u8> = (0..b.bytes).map(f).collect();
        // SAFETY: [addr, addr + bytes) lies inside a live host allocation of this process (a pool
        // slot or a buffer allocated alone), and no other thread touches it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.addr as *mut u8, data.len()) };
    }

    fn read(&self, i: usize, n: u64) -> Vec<u8> {
        let b = &self.live[i];
        assert!(n <= b.bytes);
        let mut out = vec![0u8; n as usize];
        // SAFETY: as in `write`, for the first `n <= bytes` bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.addr as *const u8, out.as_mut_ptr(), n as usize) };
        out
    }

    /// Frees the buffers whose time has come (after step `step`).
    fn free_expired(&mut self, step: usize) {
        let (gone, kept): (Vec<Buffer>, Vec<Buffer>) =
            self.live.drain(..).partition(|b| b.until <= step);
        self.live = kept;
        for b in gone {
            if let Place::Slot { pool, slot } = b.place {
                if let Some(p) = self.pools[pool].as_mut() {
                    p.used[slot] = false;
                }
            }
        }
    }

    /// Releases every pool with no live slot (PyTorch's `empty_cache`).
    fn empty_cache(&mut self) -> usize {
        let mut freed = 0;
        for p in &mut self.pools {
            if p.as_ref().is_some_and(|p| p.used.iter().all(|u| !u)) {
                *p = None;
                freed += 1;
            }
        }
        freed
    }
}

// ------------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    Kill { rank: usize, step: usize },
    Stop { rank: usize, step: usize },
}

fn shm_entries(job: &str) -> Vec<String> {
    let prefix = nvfuser_ipc::tools::host::job_prefix(job);
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

struct Outcome {
    ok: bool,
    /// Per rank: exited successfully, and its output.
    ranks: Vec<(bool, String)>,
    leaked: Vec<String>,
}

/// Runs the program of `seed` (its first `steps` steps) on `world` processes.
fn run(seed: u64, world: usize, steps: usize, fault: Fault) -> Outcome {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    // Unique among the runs this process makes at once: the tests of every world size and the
    // fault test run in parallel, over the same seeds when NVFIPC_LIFECYCLE_SEEDS names them
    // (their boards in /dev/shm are named after the job).
    let fault_tag = match fault {
        Fault::None => "",
        Fault::Kill { .. } => "k",
        Fault::Stop { .. } => "s",
    };
    let job = format!(
        "lc{}x{seed}w{world}{fault_tag}",
        std::process::id() % 100_000
    );
    let exe = std::env::current_exe().expect("test binary path");
    let fault_env = match fault {
        Fault::None => String::new(),
        Fault::Kill { rank, step } => format!("kill:{rank}:{step}"),
        Fault::Stop { rank, step } => format!("stop:{rank}:{step}"),
    };
    let mut children: Vec<Child> = (0..world)
        .map(|rank| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "child", "--nocapture"])
                .env(ROLE, "1")
                .env("NVFIPC_LC_RANK", rank.to_string())
                .env("NVFIPC_LC_WORLD", world.to_string())
                .env("NVFIPC_LC_PORT", server.port().to_string())
                .env("NVFIPC_LC_JOB", &job)
                .env("NVFIPC_LC_SEED", seed.to_string())
                .env("NVFIPC_LC_STEPS", steps.to_string())
                .env("NVFIPC_LC_FAULT", &fault_env)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let victim = match fault {
        Fault::None => None,
        Fault::Kill { rank, .. } | Fault::Stop { rank, .. } => Some(rank),
    };
    // Survivors must end on their own (bounded); then a stopped victim is killed.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status: Vec<Option<bool>> = vec![None; world];
    while Instant::now() < deadline {
        for (rank, c) in children.iter_mut().enumerate() {
            if status[rank].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    status[rank] = Some(s.success());
                }
            }
        }
        let waiting = (0..world).any(|r| status[r].is_none() && Some(r) != victim);
        if !waiting {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks: Vec<(bool, String)> = children
        .iter_mut()
        .enumerate()
        .map(|(rank, c)| {
            if status[rank].is_none() {
                let _ = c.kill();
                let done = c.wait().map(|s| s.success()).unwrap_or(false);
                // A victim is expected not to finish; anyone else still running failed.
                status[rank] = Some(Some(rank) == victim || done);
            }
            let mut out = String::new();
            if let Some(mut o) = c.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut out);
            }
            (status[rank] == Some(true) || Some(rank) == victim, out)
        })
        .collect();
    server.shutdown();
    // A killed rank cannot clean up: its boards (named after its rank) and nothing else may
    // remain.
    let mut leaked = shm_entries(&job);
    if let Some(v) = victim {
        let mine = format!("-b{v}");
        for name in leaked.iter().filter(|n| n.ends_with(&mine)) {
            nvfuser_ipc::tools::os::unlink_name(&format!("/{name}"));
        }
        leaked.retain(|n| !n.ends_with(&mine));
    }
    Outcome {
        ok: ranks.iter().all(|(ok, _)| *ok) && leaked.is_empty(),
        ranks,
        leaked,
    }
}

fn describe(outcome: &Outcome) -> String {
    let mut s = String::new();
    for (rank, (ok, out)) in outcome.ranks.iter().enumerate() {
        if !ok {
            let tail: Vec<&str> = out.lines().rev().take(25).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            s += &format!("--- rank {rank} failed:\n{}\n", tail.join("\n"));
        }
    }
    if !outcome.leaked.is_empty() {
        s += &format!("--- leaked /dev/shm entries: {:?}\n", outcome.leaked);
    }
    s
}

/// Runs a seed; on failure, finds the shortest failing prefix and panics with the seed, that
/// prefix of the program and what failed.
fn check_seed(seed: u64, world: usize, steps: usize) {
    let outcome = run(seed, world, steps, Fault::None);
    if outcome.ok {
        return;
    }
    let first = describe(&outcome);
    // Shrink: the shortest prefix that still fails (programs are prefixes of each other). A
    // failure that depends on timing may not repeat, so a prefix counts as passing only when it
    // passes twice.
    let (mut good, mut bad) = (0usize, steps);
    let passes = |n| (0..2).all(|_| run(seed, world, n, Fault::None).ok);
    while bad - good > 1 {
        let mid = (good + bad) / 2;
        if passes(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    let shortest = run(seed, world, bad, Fault::None);
    let steps_text: Vec<String> = program(seed, world, bad)
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  {i}: {s:?}"))
        .collect();
    panic!(
        "seed {seed} (world {world}) fails; shortest failing program: {bad} steps (re-run with \
         NVFIPC_LIFECYCLE_SEEDS={seed} NVFIPC_LIFECYCLE_STEPS={bad}):\n{}\nfailure of the \
         shortest:\n{}\nfailure of the full program ({steps} steps):\n{first}",
        steps_text.join("\n"),
        describe(&shortest)
    );
}

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    seeds_from_env(
        "NVFIPC_LIFECYCLE_SEEDS",
        default.chain(REGRESSION_SEEDS.iter().copied()).collect(),
    )
}

fn steps(default: usize) -> usize {
    std::env::var("NVFIPC_LIFECYCLE_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_lifecycles_of_2_ranks() {
    for seed in seeds(1..5) {
        check_seed(seed, 2, steps(400));
    }
}

#[test]
fn random_lifecycles_of_4_ranks() {
    for seed in seeds(100..104) {
        check_seed(seed, 4, steps(300));
    }
}

#[test]
fn random_lifecycles_of_3_ranks() {
    for seed in seeds(200..203) {
        check_seed(seed, 3, steps(300));
    }
}

/// One rank is killed or stopped at a random step: every other rank ends with a named error
/// within its timeout (or finishes), and nothing but the victim's board is left.
#[test]
fn a_rank_killed_or_stopped_at_a_random_step() {
    for seed in seeds(300..306) {
        let world = 3;
        let mut rng = Rng::new(seed ^ 0xdead);
        let rank = rng.below(world as u64) as usize;
        let step = rng.below(60) as usize;
        let fault = if seed % 2 == 0 {
            Fault::Kill { rank, step }
        } else {
            Fault::Stop { rank, step }
        };
        let outcome = run(seed, world, 80, fault);
        assert!(
            outcome.ok,
            "seed {seed}, {fault:?}:\n{}",
            describe(&outcome)
        );
        for (r, (_, out)) in outcome.ranks.iter().enumerate() {
            if r != rank {
                assert!(
                    out.contains("lifecycle: finished") || out.contains("lifecycle: named error"),
                    "seed {seed}, {fault:?}: rank {r} said neither:\n{out}"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Rank side
// ------------------------------------------------------------------------------------------------

fn env_num<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} unset"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} not a number"))
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

struct Rank {
    rank: usize,
    world: usize,
    job: String,
    port: u16,
    timeout: Duration,
}

impl Rank {
    fn store(&self) -> TcpStore {
        TcpStore::connect(
            "127.0.0.1",
            self.port,
            &ConnectOptions::with_timeout(Duration::from_secs(20)),
        )
        .expect("connect to the store")
    }

    fn cache(&self, scope: &str) -> nvfuser_ipc::Result<HandleCache> {
        let c = nvfuser_ipc::default_cache(CacheConfig {
            rank: self.rank,
            world_size: self.world,
            store: Arc::new(self.store()),
            job_id: self.job.clone(),
            scope: scope.to_string(),
            timeout: self.timeout,
        })?;
        c.set_linger(self.timeout);
        Ok(c)
    }
}

const SCOPES: [&str; 2] = ["", "second"];

#[test]
#[ignore = "a rank process started by the tests above"]
fn child() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let fault = std::env::var("NVFIPC_LC_FAULT").unwrap_or_default();
    let faulty = !fault.is_empty();
    let r = Rank {
        rank: env_num("NVFIPC_LC_RANK"),
        world: env_num("NVFIPC_LC_WORLD"),
        job: std::env::var("NVFIPC_LC_JOB").expect("job"),
        port: env_num("NVFIPC_LC_PORT"),
        timeout: Duration::from_secs(if faulty { 3 } else { 20 }),
    };
    nvfuser_ipc::tools::host::set_default_job(&r.job);
    let fds_before = count_dir("/proc/self/fd");
    let threads_before = count_dir("/proc/self/task");
    let result = run_rank(&r, &fault);
    match result {
        Ok(()) => println!("lifecycle: finished"),
        Err(e) if faulty => {
            println!("lifecycle: named error: {e}");
        }
        Err(e) => panic!("rank {}: {e}", r.rank),
    }
    // Nothing is left once the caches are gone and the buffers freed: the collector, releaser
    // and responder threads have ended and every descriptor is closed (bounded wait: threads
    // end asynchronously).
    let start = Instant::now();
    loop {
        let (fds, threads) = (count_dir("/proc/self/fd"), count_dir("/proc/self/task"));
        if fds <= fds_before && threads <= threads_before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "rank {}: {fds} fds (started with {fds_before}), {threads} threads (started with \
             {threads_before}) after the program",
            r.rank
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        nvfuser_ipc::tools::host::live_buffers(),
        0,
        "rank {}",
        r.rank
    );
}

/// An error a faulty run accepts: it names a rank (the victim, or a survivor that gave up on
/// it), and came within the timeout.
fn named(e: nvfuser_ipc::Error, took: Duration, r: &Rank) -> nvfuser_ipc::Error {
    assert!(
        e.message.contains("rank"),
        "rank {}: error names no rank: {e}",
        r.rank
    );
    assert!(
        took < r.timeout * 2 + Duration::from_secs(2),
        "rank {}: error after {took:?} (timeout {:?}): {e}",
        r.rank,
        r.timeout
    );
    e
}

fn run_rank(r: &Rank, fault: &str) -> nvfuser_ipc::Result<()> {
    let seed: u64 = env_num("NVFIPC_LC_SEED");
    let steps: usize = env_num("NVFIPC_LC_STEPS");
    let prog = program(seed, r.world, steps);
    let (victim, fault_step, stop) = match fault.split(':').collect::<Vec<_>>().as_slice() {
        [kind, rank, step] => (
            Some(rank.parse::<usize>().unwrap()),
            step.parse::<usize>().unwrap(),
            *kind == "stop",
        ),
        _ => (None, 0, false),
    };
    let mut own = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(r.rank as u64));
    let store = r.store();
    let barriers = BarrierState::new();
    // Both caches from the start, on every rank: a rank's n-th cache of a scope talks to its
    // peers' n-th, so every rank creates (and re-creates) each at the same agreed points.
    let mut caches: Vec<Option<HandleCache>> =
        vec![Some(r.cache(SCOPES[0])?), Some(r.cache(SCOPES[1])?)];
    let mut mem = Memory::default();
    let outcome = (|| -> nvfuser_ipc::Result<()> {
        for (step, s) in prog.iter().enumerate() {
            if victim == Some(r.rank) && step == fault_step {
                let sig = if stop { libc::SIGSTOP } else { libc::SIGKILL };
                // SAFETY: raising a signal at this process; SIGKILL/SIGSTOP cannot be caught.
                unsafe { libc::raise(sig) };
            }
            let started = Instant::now();
            // The step's error, checked as a faulty run requires.
            macro_rules! check {
                ($res:expr $(,)?) => {
                    $res.map_err(|e| {
                        let e = e.context(format!("step {step}"));
                        if victim.is_some() {
                            named(e, started.elapsed(), r)
                        } else {
                            e
                        }
                    })
                };
            }
            match s {
                Step::Recreate { cache } => {
                    check!(
                        barrier(&store, &barriers, r.rank, r.world, None, r.timeout).map(|_| ()),
                    )?;
                    if let Some(c) = caches[*cache].take() {
                        let stats = check!(c.try_close())?;
                        assert_eq!(stats.opens, stats.closes, "rank {} step {step}", r.rank);
                    }
                    caches[*cache] = Some(check!(r.cache(SCOPES[*cache]))?);
                }
                Step::Exchange { cache, comms, put } => {
                    let c = caches[*cache].as_ref().expect("every cache is alive");
                    check!(exchange_step(
                        r, c, &mut mem, &mut own, seed, step, comms, *put
                    ))?;
                    if *put {
                        check!(barrier(&store, &barriers, r.rank, r.world, None, r.timeout)
                            .map(|_| ()),)?;
                        check_puts(r, &mem, seed, step, comms);
                    }
                }
            }
            mem.free_expired(step);
            if own.chance(8) {
                mem.empty_cache();
            }
        }
        Ok(())
    })();
    // Teardown on every path: close the caches (each releases what it imported), then free
    // the memory.
    let mut closed = Ok(());
    for c in caches.iter_mut().filter_map(Option::take) {
        let transport = c.transport(MemKind::Host).cloned();
        let started = Instant::now();
        match c.try_close() {
            Ok(stats) => {
                assert_eq!(stats.opens, stats.closes, "rank {}: {stats:?}", r.rank);
                assert_eq!(stats.peers_unclosed, 0);
            }
            // A peer that died or stopped does not close: named, and still nothing leaks.
            Err(e) if victim.is_some() => {
                if closed.is_ok() {
                    closed = Err(named(e, started.elapsed(), r));
                }
            }
            Err(e) => panic!("rank {}: close: {e}", r.rank),
        }
        if let Some(t) = transport {
            assert_eq!(t.live_mappings(), 0, "rank {}", r.rank);
        }
    }
    mem.free_expired(usize::MAX);
    mem.empty_cache();
    drop(mem);
    outcome.and(closed)
}

/// What this rank does in one communication, and where.
struct Part {
    comm: usize,
    req: Request,
    buffer: usize,
}

/// One batch: allocate this rank's side of every communication, exchange, read each peer's
/// buffer through its mapping, move the data with the host primitives and check it; with `put`,
/// every sender then writes into its receiver's buffer through the mapping.
#[allow(clippy::too_many_arguments)]
fn exchange_step(
    r: &Rank,
    cache: &HandleCache,
    mem: &mut Memory,
    own: &mut Rng,
    seed: u64,
    step: usize,
    comms: &[Comm],
    put: bool,
) -> nvfuser_ipc::Result<()> {
    let mut parts: Vec<Part> = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        for (me, peer, send) in [(c.src, c.dst, true), (c.dst, c.src, false)] {
            if me != r.rank {
                continue;
            }
            let bytes = match own.below(10) {
                0 => 1 + own.below(16),
                1..=5 => 1 + own.below(SLOT_BYTES / 2),
                6..=8 => 4096 * (1 + own.below(8)),
                _ => POOL_BYTES + own.below(POOL_BYTES),
            };
            let until = step + own.below(4) as usize;
            let buffer = mem.alloc(own, bytes, until);
            let addr = mem.live[buffer].addr;
            if send {
                mem.write(buffer, |k| pattern(seed, step, i, 0, k));
            } else {
                mem.write(buffer, |_| 0);
            }
            let req = if send {
                Request::send(peer, c.tag, addr, bytes, MemKind::Host)
            } else {
                Request::recv(peer, c.tag, addr, bytes, MemKind::Host)
            };
            parts.push(Part {
                comm: i,
                req,
                buffer,
            });
        }
    }
    PUTS.with(|puts| puts.borrow_mut().clear());
    if parts.is_empty() {
        return Ok(());
    }
    // This rank's order: shuffled, keeping the order among equal (peer, direction, tag)
    // requests (their occurrences pair up in order on the two sides).
    let order = shuffled_keeping_occurrences(own, &parts);
    let reqs: Vec<Request> = order.iter().map(|&i| parts[i].req.clone()).collect();
    cache.exchange_handles(&reqs)?;
    let handles: Vec<P2pHandles> = parts
        .iter()
        .map(|p| cache.get(&p.req))
        .collect::<nvfuser_ipc::Result<_>>()?;
    // Reads through the mapping: the sender's current content.
    for (p, h) in parts.iter().zip(&handles) {
        if p.req.direction == nvfuser_ipc::Direction::Recv {
            let n = h.peer_bytes.min(p.req.bytes);
            let mut got = vec![0u8; n as usize];
            // SAFETY: peer_ptr maps at least peer_bytes readable bytes of the peer's live buffer
            // (the sender frees it only after this rank's transfer below, or the step's barrier).
            unsafe {
                std::ptr::copy_nonoverlapping(h.peer_ptr as *const u8, got.as_mut_ptr(), n as usize)
            };
            expect(
                &got,
                |k| pattern(seed, step, p.comm, 0, k),
                r,
                step,
                p,
                "read",
            )?;
        }
    }
    if put {
        // Writes through the mappings instead of transfers: every sender writes into its
        // receiver's buffer (which the receiver zeroed before it published it, and reads only
        // after the step's barrier).
        for (p, h) in parts.iter().zip(&handles) {
            if p.req.direction == nvfuser_ipc::Direction::Send {
                let n = h.peer_bytes.min(p.req.bytes) as usize;
                let data: Vec<u8> = (0..n as u64)
                    .map(|k| pattern(seed, step, p.comm, 1, k))
                    .collect();
                // SAFETY: peer_ptr maps peer_bytes writable bytes of the receiver's live
                // buffer, which it frees only after the step's barrier.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.peer_ptr as *mut u8, n) };
            }
        }
    } else {
        // Transfers: every send posted, then every receive pulled, then every send awaited.
        for (p, h) in parts.iter().zip(&handles) {
            if p.req.direction == nvfuser_ipc::Direction::Send {
                nvfuser_ipc::host_p2p_send_post(h)?;
            }
        }
        for (p, h) in parts.iter().zip(&handles) {
            if p.req.direction == nvfuser_ipc::Direction::Recv {
                let n = h.peer_bytes.min(p.req.bytes);
                nvfuser_ipc::host_p2p_recv_post(h, n, r.timeout)?;
                let got = mem.read(p.buffer, n);
                let want = |k| pattern(seed, step, p.comm, 0, k);
                expect(&got, want, r, step, p, "copy")?;
            }
        }
        for (p, h) in parts.iter().zip(&handles) {
            if p.req.direction == nvfuser_ipc::Direction::Send {
                nvfuser_ipc::host_p2p_send_wait(h, r.timeout)?;
            }
        }
        return Ok(());
    }
    PUTS.with(|puts| {
        let mut puts = puts.borrow_mut();
        puts.clear();
        for (p, h) in parts.iter().zip(&handles) {
            if p.req.direction == nvfuser_ipc::Direction::Recv {
                puts.insert(p.buffer, (p.comm, h.peer_bytes.min(p.req.bytes)));
            }
        }
    });
    Ok(())
}

thread_local! {
    /// The receive buffers of the last step: buffer index -> (comm, bytes the sender wrote).
    static PUTS: std::cell::RefCell<HashMap<usize, (usize, u64)>> =
        std::cell::RefCell::new(HashMap::new());
}

/// After a step's barrier: every receive buffer holds what its sender wrote through the mapping.
fn check_puts(r: &Rank, mem: &Memory, seed: u64, step: usize, _comms: &[Comm]) {
    PUTS.with(|puts| {
        for (&buffer, &(comm, n)) in puts.borrow().iter() {
            let got = mem.read(buffer, n);
            if let Some(k) = (0..n).find(|&k| got[k as usize] != pattern(seed, step, comm, 1, k)) {
                panic!(
                    "rank {} step {step}: byte {k} of {n} that the sender of comm {comm} wrote \
                     through its mapping is {} (expected {})",
                    r.rank,
                    got[k as usize],
                    pattern(seed, step, comm, 1, k)
                );
            }
        }
    });
}

fn expect(
    got: &[u8],
    want: impl Fn(u64) -> u8,
    r: &Rank,
    step: usize,
    p: &Part,
    what: &str,
) -> nvfuser_ipc::Result<()> {
    if let Some(k) = (0..got.len()).find(|&k| got[k] != want(k as u64)) {
        panic!(
            "rank {} step {step}: {what} of comm {} ({:?} peer {} tag {:?}): byte {k} of {} is \
             {} (expected {}): not the exporter's current content",
            r.rank,
            p.comm,
            p.req.direction,
            p.req.peer,
            p.req.tag,
            got.len(),
            got[k],
            want(k as u64)
        );
    }
    Ok(())
}

fn shuffled_keeping_occurrences(rng: &mut Rng, parts: &[Part]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..parts.len()).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    // Within each group of equal (peer, direction, tag), put the group's members back in their
    // original order at the positions the shuffle gave the group.
    let key = |p: &Part| (p.req.peer, p.req.direction, p.req.tag.clone());
    let mut groups: HashMap<_, Vec<usize>> = HashMap::new();
    for &i in &order {
        groups.entry(key(&parts[i])).or_default().push(i);
    }
    for members in groups.values_mut() {
        members.sort_unstable();
        members.reverse();
    }
    order
        .iter()
        .map(|&i| {
            groups
                .get_mut(&key(&parts[i]))
                .and_then(Vec::pop)
                .expect("each position takes one member of its group")
        })
        .collect()
}
