//! The exchange protocol across real processes over the host transport.
//!
//! Each test starts a store server in the test process and re-executes this test binary once per
//! rank, running the ignored `child` test with the scenario, rank, world size, port and job id in
//! the environment. After the ranks exit, the test checks that the job left nothing in /dev/shm.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::tools::fdpass::{FdPass, FdPassConfig};
use nvfuser_ipc::tools::names;
use nvfuser_ipc::HostBuffer;
use nvfuser_ipc::Status;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind, P2pHandles, Request};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
// The CLI's device buffers (the library allocates no device memory).
#[allow(dead_code)]
#[path = "../cli/src/device_buffer.rs"]
mod device_buffer;
use common::{env_usize, jitter, Ranks};

const ROLE: &str = "NVFIPC_EXCHANGE_CHILD";
const T: Duration = Duration::from_secs(20);
/// How long a scenario's ranks may run in all.
const RANK_LIMIT: Duration = Duration::from_secs(50);

// ------------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------------

fn job_id(scenario: &str) -> String {
    // Short and name-safe so that it is used verbatim in shm names.
    let tag: String = scenario
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(6)
        .collect();
    format!("x{tag}{}", std::process::id() % 100_000)
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

/// Runs `scenario` on `world` processes; returns each rank's (exit success, stdout+stderr).
fn run_ranks(scenario: &str, world: usize) -> Vec<(bool, String)> {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id(scenario);
    let results = Ranks::spawn(ROLE, scenario, world, server.port(), &job).collect(RANK_LIMIT);
    server.shutdown();
    let left = shm_entries(&job);
    assert!(
        left.is_empty(),
        "{scenario}: leaked /dev/shm entries: {left:?}"
    );
    results
}

fn assert_all_ok(scenario: &str, world: usize) {
    let results = run_ranks(scenario, world);
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, (ok, _))| !ok)
        .map(|(rank, (_, out))| format!("--- rank {rank}:\n{out}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{scenario}: ranks failed:\n{}",
        failed.join("\n")
    );
}

#[test]
fn seed_race_reexport_every_step() {
    assert_all_ok("seed_race", 2);
}

#[test]
fn several_requests_per_pair_in_differently_ordered_batches() {
    assert_all_ok("batch", 2);
}

#[test]
fn ring_of_8() {
    assert_all_ok("ring", 8);
}

#[test]
fn all_to_all_of_8() {
    assert_all_ok("all_to_all", 8);
}

#[test]
fn asymmetric_miss_moves_data_to_the_current_buffers() {
    assert_all_ok("asymmetric", 2);
}

#[test]
fn missing_peer_times_out_and_leaks_nothing() {
    assert_all_ok("timeout", 2);
}

#[test]
fn check_once_exchanges_that_find_the_peer_not_ready_can_be_retried() {
    assert_all_ok("check_once", 2);
}

#[test]
fn buffers_carved_from_known_allocations_go_through_the_board_alone() {
    assert_all_ok("pool", 2);
}

/// Rank 1 is killed (SIGKILL) while rank 0 is blocked waiting for its next step: rank 0's call
/// fails with an error naming rank 1 and its exit, well within its timeout.
#[test]
fn a_peer_killed_while_the_waiter_blocks_is_named_before_the_timeout() {
    run_with_peer_killed("killed_wait", "r0-waiting").assert_nothing_else_left();
}

/// A two-rank run whose rank 1 was killed (SIGKILL) and reaped while rank 0 waited on it; rank 0
/// passed.
struct PeerKilled {
    server: StoreServer,
    store: TcpStore,
    job: String,
    victim_pid: u32,
    killed_at: u64,
}

/// Runs `scenario` on two ranks and kills rank 1 300 ms after rank 0 stamped `{job}/{r0_key}`,
/// long enough for rank 0 to pass its spins and block on rank 1; rank 0 must then pass.
fn run_with_peer_killed(scenario: &str, r0_key: &str) -> PeerKilled {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id(scenario);
    let mut ranks = Ranks::spawn(ROLE, scenario, 2, server.port(), &job);
    let store = TcpStore::connect("127.0.0.1", server.port(), &ConnectOptions::with_timeout(T))
        .expect("connect to the store");
    store
        .get(&format!("{job}/{r0_key}"), T)
        .unwrap_or_else(|e| panic!("rank 0 never stamped {r0_key}: {e}"));
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = now_ns();
    let victim = &mut ranks.children[1];
    let victim_pid = victim.id();
    victim.kill().expect("SIGKILL rank 1");
    victim.wait().expect("reap rank 1");
    let results = ranks.collect(RANK_LIMIT);
    assert!(results[0].0, "rank 0 failed:\n{}", results[0].1);
    PeerKilled {
        server,
        store,
        job,
        victim_pid,
        killed_at,
    }
}

impl PeerKilled {
    /// A killed rank cannot clean up: what it left in /dev/shm is removed, then nothing else of
    /// the job may remain (rank 0 released all it made).
    fn assert_nothing_else_left(self) {
        drop(self.store);
        self.server.shutdown();
        let prefix = nvfuser_ipc::tools::host::job_prefix(&self.job);
        let victims = format!("{prefix}{}-", self.victim_pid);
        let (killed, others): (Vec<String>, Vec<String>) = shm_entries(&self.job)
            .into_iter()
            .partition(|n| n.starts_with(&victims) || *n == format!("{prefix}g1-b1"));
        for name in &killed {
            nvfuser_ipc::tools::os::unlink_name(&format!("/{name}"));
        }
        assert!(
            others.is_empty(),
            "rank 0 leaked /dev/shm entries: {others:?}"
        );
    }
}

#[test]
fn peer_exit_is_reported_before_the_timeout() {
    assert_all_ok("peer_exit", 2);
}

#[test]
fn warm_hits_cost_report() {
    for (rank, (_, out)) in run_ranks("warm", 2).iter().enumerate() {
        for line in out.lines().filter_map(|l| l.split_once("warm:")) {
            println!("rank {rank} warm:{}", line.1);
        }
    }
    assert_all_ok("warm", 2);
}

/// Device memory through the CUDA transport and the device primitives (skipped without a GPU).
#[test]
fn device_buffers_between_processes() {
    if !nvfuser_ipc::tools::cuda::driver::is_available() {
        eprintln!("skipped: no CUDA driver on this machine");
        return;
    }
    assert_all_ok("device", 2);
}

#[test]
fn c_abi_between_processes() {
    let results = run_ranks("c_abi", 2);
    for (rank, (ok, out)) in results.iter().enumerate() {
        assert!(ok, "c_abi: rank {rank} failed:\n{out}");
        // The context's own job id names the host buffers and boards: none may be left.
        let jobs: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once("job-id:").map(|(_, j)| j.trim()))
            .collect();
        assert_eq!(jobs.len(), 1, "rank {rank} did not finish:\n{out}");
        for job in jobs {
            let left = shm_entries(job);
            assert!(left.is_empty(), "rank {rank}: leaked {left:?}");
        }
    }
}

/// Every rank frees its cache and creates a new one of the same scope every few steps (after a
/// world barrier), with fresh buffers each step on reused tags: a new cache never reads what an
/// old one left on a board or in the store.
#[test]
fn caches_recreated_in_a_loop() {
    assert_all_ok("recreate", 4);
    assert_all_ok("recreate", 2);
}

/// Symmetric memory through the C ABI at 4 ranks: every rank maps every other's buffer with no
/// barrier, a second rendezvous costs no store traffic, a pair of ranks rendezvous while the
/// others do not take part, and bad arguments are refused.
#[test]
fn symmetric_rendezvous_without_barriers() {
    assert_all_ok("symmetric", 4);
}

#[test]
fn one_cache_from_several_threads() {
    assert_all_ok("threads", 2);
}

/// Rank 0 closes first while rank 1 keeps its mappings of rank 0's memory for 300 ms: rank 0's
/// close returns only once rank 1 has closed (checked by rank 0 through timestamps in the store).
#[test]
fn close_waits_for_the_peer_that_still_maps_this_rank() {
    assert_all_ok("linger", 2);
}

/// Rank 1 holds rank 0's memory mapped and is killed (SIGKILL) while rank 0 waits in its close:
/// rank 0's close returns within a second of the kill, without reporting a timeout.
#[test]
fn close_returns_promptly_when_the_peer_is_killed() {
    let run = run_with_peer_killed("killed", "r0-closing");
    let closed_at = stamp(&run.store, &format!("{}/r0-closed", run.job));
    assert!(
        closed_at > run.killed_at,
        "rank 0's close returned before rank 1 was killed"
    );
    let after_kill = Duration::from_nanos(closed_at - run.killed_at);
    assert!(
        after_kill < Duration::from_secs(1),
        "returned {after_kill:?} after the kill"
    );
    println!("rank 0's close returned {after_kill:?} after rank 1 was killed");
    run.assert_nothing_else_left();
}

#[test]
fn a_board_truncated_under_its_owner_and_peer_is_a_named_error_for_both() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id("truncated");
    let mut ranks = Ranks::spawn(ROLE, "truncated", 2, server.port(), &job);
    let store = TcpStore::connect("127.0.0.1", server.port(), &ConnectOptions::with_timeout(T))
        .expect("connect to the store");
    for rank in 0..2 {
        stamp(&store, &format!("{job}/r{rank}-waiting"));
    }
    // Both ranks are in an exchange that waits on the other; a process of the same uid then
    // truncates rank 0's board, which both map.
    std::thread::sleep(Duration::from_millis(200));
    let board = format!("/dev/shm{}", names::CacheNames::new(&job, "", 1).board(0));
    let truncated_at = now_ns();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&board)
        .and_then(|f| f.set_len(0))
        .unwrap_or_else(|e| panic!("truncating {board}: {e}"));
    let results = ranks.collect(RANK_LIMIT);
    for (rank, (ok, out)) in results.iter().enumerate() {
        assert!(ok, "rank {rank} did not survive the truncation:\n{out}");
        let failed_at = stamp(&store, &format!("{job}/r{rank}-failed"));
        let after = Duration::from_nanos(failed_at.saturating_sub(truncated_at));
        assert!(
            after < Duration::from_secs(2),
            "rank {rank}: {after:?}\n{out}"
        );
        println!("rank {rank} reported the truncation {after:?} after it:\n{out}");
    }
    drop(store);
    server.shutdown();
    let left = shm_entries(&job);
    assert!(left.is_empty(), "leaked /dev/shm entries: {left:?}");
}

// ------------------------------------------------------------------------------------------------
// Rank side
// ------------------------------------------------------------------------------------------------

struct Rank {
    rank: usize,
    world: usize,
    job: String,
    cache: HandleCache,
}

impl Rank {
    fn from_env() -> Rank {
        let rank = env_usize("NVFIPC_T_RANK");
        let world = env_usize("NVFIPC_T_WORLD");
        let job = std::env::var("NVFIPC_T_JOB").expect("job id");
        nvfuser_ipc::tools::host::set_default_job(&job);
        let cache = new_cache(rank, world, &job);
        Rank {
            rank,
            world,
            job,
            cache,
        }
    }

    fn next(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn prev(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    /// Ends the rank: tears the cache down (every peer must close too) and checks the open/close
    /// balance.
    fn finish(self) {
        let transport = self.cache.transport(MemKind::Host).unwrap().clone();
        let stats = self.cache.try_close().expect("close");
        assert_eq!(stats.opens, stats.closes, "rank {}: {stats:?}", self.rank);
        assert_eq!((stats.peers_unclosed, stats.leaked_slabs), (0, 0));
        assert_eq!(transport.live_mappings(), 0);
    }
}

/// A cache of the scenario's job (scope "") on a store connection of its own.
fn new_cache(rank: usize, world: usize, job: &str) -> HandleCache {
    nvfuser_ipc::default_cache(CacheConfig {
        rank,
        world_size: world,
        store: Arc::new(test_store()),
        job_id: job.to_string(),
        scope: String::new(),
        timeout: T,
    })
    .expect("cache")
}

fn filled(len: u64, value: u8) -> HostBuffer {
    let b = nvfuser_ipc::host_alloc(len).expect("host alloc");
    b.write(0, &vec![value; len as usize]).unwrap();
    b
}

/// A client of the scenario's store.
fn test_store() -> TcpStore {
    TcpStore::connect(
        "127.0.0.1",
        env_usize("NVFIPC_T_PORT") as u16,
        &ConnectOptions::with_timeout(T),
    )
    .expect("connect to the store")
}

/// Wall-clock nanoseconds, comparable between the processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// Stores the current time under `key`.
fn set_stamp(store: &TcpStore, key: &str) -> u64 {
    let t = now_ns();
    store.set(key, t.to_string().as_bytes()).unwrap();
    t
}

/// Reads a time stored by [`set_stamp`] (waiting for it, bounded).
fn stamp(store: &TcpStore, key: &str) -> u64 {
    let v = store.get(key, T).unwrap_or_else(|e| panic!("{key}: {e}"));
    String::from_utf8_lossy(&v)
        .parse()
        .unwrap_or_else(|_| panic!("{key}: not a time: {v:?}"))
}

fn first_byte(b: &HostBuffer) -> u8 {
    let mut x = [0u8; 1];
    b.read(0, &mut x).unwrap();
    x[0]
}

fn peer_bytes(h: &P2pHandles, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    assert!(n as u64 <= h.peer_bytes);
    // SAFETY: peer_ptr maps at least peer_bytes readable bytes of the peer's live buffer.
    unsafe { std::ptr::copy_nonoverlapping(h.peer_ptr as *const u8, out.as_mut_ptr(), n) };
    out
}

#[test]
#[ignore = "a rank process started by the tests above"]
fn child() {
    let Ok(scenario) = std::env::var(ROLE) else {
        return;
    };
    let r = Rank::from_env();
    match scenario.as_str() {
        "seed_race" => seed_race(r),
        "batch" => batch(r),
        "ring" => ring(r),
        "all_to_all" => all_to_all(r),
        "asymmetric" => asymmetric(r),
        "timeout" => timeout(r),
        "check_once" => check_once(r),
        "threads" => threads(r),
        "peer_exit" => peer_exit(r),
        "warm" => warm(r),
        "device" => device(r),
        "c_abi" => c_abi(r),
        "linger" => linger(r),
        "killed" => killed(r),
        "recreate" => recreate(r),
        "symmetric" => symmetric(r),
        "truncated" => truncated(r),
        "pool" => pool(r),
        "killed_wait" => killed_wait(r),
        other => panic!("unknown scenario {other}"),
    }
}

/// Rank 0 sends from a new buffer at every step (re-exporting before rank 1 has necessarily read
/// the previous record); rank 1 receives with jitter. Every transfer must carry that step's data.
fn seed_race(r: Rank) {
    const STEPS: usize = 12;
    let recv_buf = filled(256, 0);
    let mut keep = Vec::new();
    for step in 0..STEPS {
        jitter(r.rank, step, 2000);
        if r.rank == 0 {
            let b = filled(256, step as u8 + 1);
            let req = Request::send(1, "seed", b.addr(), 256, MemKind::Host);
            r.cache
                .exchange_handles(std::slice::from_ref(&req))
                .unwrap();
            let h = r.cache.get(&req).unwrap();
            nvfuser_ipc::host_p2p_send_post(&h).unwrap();
            nvfuser_ipc::host_p2p_send_wait(&h, T).unwrap();
            keep.push(b); // the buffer stays alive, so each step is a genuinely new allocation
        } else {
            let req = Request::recv(0, "seed", recv_buf.addr(), 256, MemKind::Host);
            r.cache
                .exchange_handles(std::slice::from_ref(&req))
                .unwrap();
            let h = r.cache.get(&req).unwrap();
            nvfuser_ipc::host_p2p_recv_post(&h, 256, T).unwrap();
            assert_eq!(first_byte(&recv_buf), step as u8 + 1, "step {step}");
        }
    }
    let s = r.cache.stats();
    if r.rank == 0 {
        assert_eq!(s.records_sent, STEPS as u64);
    } else {
        assert_eq!(s.records_received, STEPS as u64);
    }
    assert_eq!(s.misses, STEPS as u64);
    r.finish();
}

/// Several requests between ranks 0 and 1 in one batch: both directions, a tag used twice per
/// direction, and rank 1 listing them in another order (repeats keep their relative order, which
/// is what pairs the k-th SEND of a tag with the peer's k-th RECV of it).
fn batch(r: Rank) {
    let peer = 1 - r.rank;
    let bufs: Vec<HostBuffer> = (0..6)
        .map(|i| filled(64, (r.rank * 10 + i) as u8))
        .collect();
    let plan = [
        (true, "dup"),
        (true, "dup"),
        (true, "other"),
        (false, "dup"),
        (false, "dup"),
        (false, "other"),
    ];
    let req = |i: usize| {
        let (send, tag) = plan[i];
        if send {
            Request::send(peer, tag, bufs[i].addr(), 64, MemKind::Host)
        } else {
            Request::recv(peer, tag, bufs[i].addr(), 64, MemKind::Host)
        }
    };
    let order: Vec<usize> = if r.rank == 0 {
        (0..6).collect()
    } else {
        vec![5, 3, 2, 0, 4, 1]
    };
    let reqs: Vec<Request> = order.iter().map(|&i| req(i)).collect();
    for round in 0..3 {
        let before = r.cache.stats();
        r.cache.exchange_handles(&reqs).unwrap();
        let after = r.cache.stats();
        let trips = after.store_round_trips - before.store_round_trips;
        if round == 0 {
            assert_eq!(
                trips, 2,
                "a miss batch takes one multi_set and one multi_get"
            );
            assert_eq!(after.records_sent, 6);
        } else {
            assert_eq!(trips, 0, "round {round}: all hits");
            assert_eq!(after.hits - before.hits, 6);
        }
    }
    // My buffer i is paired with the peer's buffer `partner[i]`, whose first byte is
    // peer * 10 + partner[i].
    let partner = [3, 4, 5, 0, 1, 2];
    for (i, &j) in partner.iter().enumerate() {
        let h = r.cache.get(&req(i)).unwrap();
        assert_eq!(peer_bytes(&h, 1)[0], (peer * 10 + j) as u8, "request {i}");
    }
    r.finish();
}

/// Each rank sends to the next and receives from the previous, moving data with the host
/// primitives; repeated steps are hits with zero store traffic.
fn ring(r: Rank) {
    let send = filled(4096, 0);
    let recv = filled(4096, 0);
    let reqs = [
        Request::send(r.next(), "ring", send.addr(), 4096, MemKind::Host),
        Request::recv(r.prev(), "ring", recv.addr(), 4096, MemKind::Host),
    ];
    for step in 0..5u8 {
        send.write(0, &[r.rank as u8 * 16 + step; 4096]).unwrap();
        let before = r.cache.stats();
        r.cache.exchange_handles(&reqs).unwrap();
        let after = r.cache.stats();
        if step > 0 {
            assert_eq!(after.store_round_trips, before.store_round_trips);
            assert_eq!(after.hits - before.hits, 2);
        }
        let hs = r.cache.get(&reqs[0]).unwrap();
        let hr = r.cache.get(&reqs[1]).unwrap();
        nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
        nvfuser_ipc::host_p2p_recv_post(&hr, 4096, T).unwrap();
        nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
        let mut got = vec![0u8; 4096];
        recv.read(0, &mut got).unwrap();
        let want = r.prev() as u8 * 16 + step;
        assert!(got.iter().all(|&b| b == want), "step {step}");
    }
    // The host buffers crossed processes as file descriptors: this rank's fd responder served
    // its peers' imports (buffers and semaphore slab), and nothing of them is named in /dev/shm.
    let fdpass = FdPass::for_job(
        Arc::new(test_store()),
        &names::fdpass_prefix(&r.job),
        &names::job_tag(&r.job),
        r.rank,
        FdPassConfig::from_env().unwrap(),
    );
    let (_, fds_sent, _, _, _) = fdpass.responder_stats().expect("the transport's responder");
    assert!(fds_sent >= 2, "rank {}: {fds_sent} fds sent", r.rank);
    let names = shm_entries(&r.job);
    assert!(names.iter().all(|n| names::is_board_name(n)), "{names:?}");
    drop(fdpass);
    r.finish();
}

/// Every rank sends a buffer to and receives one from every other rank, in one batch.
fn all_to_all(r: Rank) {
    let mut bufs = Vec::new();
    let mut reqs = Vec::new();
    for p in (0..r.world).filter(|&p| p != r.rank) {
        let s = filled(128, (r.rank * 8 + p) as u8);
        let d = filled(128, 0);
        reqs.push(Request::send(p, "a2a", s.addr(), 128, MemKind::Host));
        reqs.push(Request::recv(p, "a2a", d.addr(), 128, MemKind::Host));
        bufs.push((p, s, d));
    }
    // Rotate the batch per rank so request orders differ.
    let n = reqs.len();
    reqs.rotate_left(r.rank % n);
    r.cache.exchange_handles(&reqs).unwrap();
    let s = r.cache.stats();
    assert!(s.store_round_trips <= 2, "{s:?}");
    for (p, sbuf, dbuf) in &bufs {
        let hs = r
            .cache
            .get(&Request::send(*p, "a2a", sbuf.addr(), 128, MemKind::Host))
            .unwrap();
        let hr = r
            .cache
            .get(&Request::recv(*p, "a2a", dbuf.addr(), 128, MemKind::Host))
            .unwrap();
        // The peer's recv buffer is still zero; its send buffer holds p*8 + me.
        assert_eq!(peer_bytes(&hs, 128), vec![0u8; 128]);
        assert_eq!(peer_bytes(&hr, 128), vec![(p * 8 + r.rank) as u8; 128]);
    }
    r.cache.exchange_handles(&reqs).unwrap();
    assert_eq!(r.cache.stats().store_round_trips, s.store_round_trips);
    r.finish();
}

/// A ring over fresh buffers every step (three tags in turn, buffers freed two steps later so
/// that their addresses come back); every fifth step all ranks pass a world barrier, free their
/// caches and create new ones. Every transfer must carry its step's data.
fn recreate(r: Rank) {
    const STEPS: usize = 31;
    const LEN: u64 = 4096;
    let (rank, world, job) = (r.rank, r.world, r.job.clone());
    let (next, prev) = (r.next(), r.prev());
    let store = test_store();
    let barriers = nvfuser_ipc::tools::barrier::BarrierState::new();
    let mut cache = Some(r.cache);
    let mut kept: Vec<(HostBuffer, HostBuffer)> = Vec::new();
    for step in 0..STEPS {
        if step > 0 && step % 5 == 0 {
            nvfuser_ipc::tools::barrier::barrier(&store, &barriers, rank, world, None, T).unwrap();
            let stats = cache.take().unwrap().try_close().expect("close");
            assert_eq!(stats.opens, stats.closes, "rank {rank} step {step}");
            kept.clear();
            cache = Some(new_cache(rank, world, &job));
        }
        let c = cache.as_ref().unwrap();
        let tag = ["a", "b", "c"][step % 3];
        let value = (step * 8 + rank + 1) as u8;
        let (send, recv) = (filled(LEN, value), filled(LEN, 0));
        let reqs = [
            Request::send(next, tag, send.addr(), LEN, MemKind::Host),
            Request::recv(prev, tag, recv.addr(), LEN, MemKind::Host),
        ];
        jitter(rank, step, 2000);
        c.exchange_handles(&reqs)
            .unwrap_or_else(|e| panic!("rank {rank} step {step}: {e}"));
        let hs = c.get(&reqs[0]).unwrap();
        let hr = c.get(&reqs[1]).unwrap();
        nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
        nvfuser_ipc::host_p2p_recv_post(&hr, LEN, T).unwrap();
        nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
        let want = (step * 8 + prev + 1) as u8;
        let mut got = vec![0u8; LEN as usize];
        recv.read(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == want), "rank {rank} step {step}");
        kept.push((send, recv));
        if kept.len() > 2 {
            kept.remove(0);
        }
    }
    Rank {
        rank,
        world,
        job,
        cache: cache.take().unwrap(),
    }
    .finish();
}

/// Rank 0 changes its buffers every other step, rank 1 never does. Each step moves data both ways
/// with the host primitives into the current buffers.
fn asymmetric(r: Rank) {
    let peer = 1 - r.rank;
    let fixed_send = filled(512, 0);
    let fixed_recv = filled(512, 0);
    let mut pool = Vec::new();
    for step in 0..8usize {
        let (send, recv) = if r.rank == 0 {
            if step % 2 == 0 {
                pool.push((filled(512, 0), filled(512, 0)));
            }
            let (s, d) = pool.last().unwrap();
            (s, d)
        } else {
            (&fixed_send, &fixed_recv)
        };
        let value = (step * 2 + r.rank + 1) as u8;
        send.write(0, &[value; 512]).unwrap();
        let reqs = [
            Request::send(peer, "fwd", send.addr(), 512, MemKind::Host),
            Request::recv(peer, "fwd", recv.addr(), 512, MemKind::Host),
        ];
        let before = r.cache.stats();
        jitter(r.rank, step, 2000);
        r.cache.exchange_handles(&reqs).unwrap();
        let trips = r.cache.stats().store_round_trips - before.store_round_trips;
        let expected = match step {
            0 => 2,
            s if s % 2 == 0 => 1, // rank 0 publishes, rank 1 fetches
            _ => 0,
        };
        assert_eq!(trips, expected, "rank {} step {step}", r.rank);
        let hs = r.cache.get(&reqs[0]).unwrap();
        let hr = r.cache.get(&reqs[1]).unwrap();
        nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
        nvfuser_ipc::host_p2p_recv_post(&hr, 512, T).unwrap();
        nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
        let want = (step * 2 + peer + 1) as u8;
        let mut got = vec![0u8; 512];
        recv.read(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == want),
            "rank {} step {step}",
            r.rank
        );
    }
    r.finish();
}

/// Rank 1 never joins channel "late"; rank 0 must time out quickly with a precise message and
/// leak nothing. Rank 1 then joins channel "other" to show the peer-present message.
fn timeout(r: Rank) {
    let b = filled(64, 1);
    if r.rank == 0 {
        let req = Request::send(1, "late", b.addr(), 64, MemKind::Host);
        let start = Instant::now();
        let err = r
            .cache
            .exchange_handles_timeout(&[req], Duration::from_millis(300))
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(err.status, Status::Timeout, "{err}");
        for needle in ["rank 0", "peer rank 1", "\"late\"", "step 1", "board entry"] {
            assert!(err.message.contains(needle), "missing {needle:?}: {err}");
        }
        let b2 = filled(64, 2);
        let req = Request::recv(1, "other", b2.addr(), 64, MemKind::Host);
        let err = r
            .cache
            .exchange_handles_timeout(&[req], Duration::from_millis(300))
            .unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
        // Rank 1 sends on "other" only after a sync through the store, so either message is
        // possible here; both name the board entry of the peer.
        assert!(err.message.contains("-b1"), "{err}");
        drop(b2);
    }
    let job_done_key = format!("{}/timeout-done", r.job);
    let store = test_store();
    if r.rank == 0 {
        store.set(&job_done_key, b"1").unwrap();
    } else {
        store.get(&job_done_key, T).unwrap();
    }
    drop(b);
    r.finish();
}

/// Retries an exchange with a zero timeout ("check once") until it succeeds; returns how many
/// checks found the peer not ready. Any other error fails the rank.
fn until_ready(r: &Rank, reqs: &[Request]) -> usize {
    let start = Instant::now();
    let mut not_ready = 0;
    loop {
        match r.cache.exchange_handles_timeout(reqs, Duration::ZERO) {
            Ok(()) => return not_ready,
            Err(e) if e.status == Status::Timeout => not_ready += 1,
            Err(e) => panic!("rank {}: check {not_ready} failed: {e}", r.rank),
        }
        assert!(start.elapsed() < T, "rank {}: never ready", r.rank);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Both ranks exchange with a zero timeout, retrying while the peer is not ready: rank 1 starts
/// late (rank 0's checks find it at an earlier step), then both re-export new buffers at once
/// (each check may find the peer not yet done opening). No check poisons a channel, and the data
/// that arrives is the current buffer's.
fn check_once(r: Rank) {
    let peer = 1 - r.rank;
    if r.rank == 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut not_ready = Vec::new();
    for round in 0..3u8 {
        let mine = filled(4096, 10 * round + r.rank as u8);
        let theirs = filled(4096, 0);
        let reqs = [
            Request::send(peer, "once", mine.addr(), 4096, MemKind::Host),
            Request::recv(peer, "once", theirs.addr(), 4096, MemKind::Host),
        ];
        not_ready.push(until_ready(&r, &reqs));
        let h = r.cache.get(&reqs[1]).expect("handles of the recv side");
        assert_eq!(
            peer_bytes(&h, 4096),
            vec![10 * round + peer as u8; 4096],
            "rank {} round {round}",
            r.rank
        );
        // Both ranks keep their buffers until the peer has read them.
        let store = test_store();
        let key = format!("{}/once/{round}/{}", r.job, r.rank);
        store.set(&key, b"1").unwrap();
        store
            .get(&format!("{}/once/{round}/{peer}", r.job), T)
            .unwrap();
    }
    if r.rank == 0 {
        assert!(not_ready[0] > 0, "rank 1 started late, yet {not_ready:?}");
    }
    println!("rank {}: not ready {not_ready:?}", r.rank);
    r.finish();
}

/// Four threads per rank, each with its own tag, exchange and transfer concurrently on one cache.
fn threads(r: Rank) {
    let peer = 1 - r.rank;
    std::thread::scope(|s| {
        for t in 0..4usize {
            let cache = &r.cache;
            s.spawn(move || {
                let send = filled(256, 0);
                let recv = filled(256, 0);
                let tag = format!("thread{t}");
                let reqs = [
                    Request::send(peer, tag.clone(), send.addr(), 256, MemKind::Host),
                    Request::recv(peer, tag, recv.addr(), 256, MemKind::Host),
                ];
                for step in 0..20usize {
                    let v = (r.rank * 100 + t * 20 + step) as u8;
                    send.write(0, &[v; 256]).unwrap();
                    cache.exchange_handles(&reqs).unwrap();
                    let hs = cache.get(&reqs[0]).unwrap();
                    let hr = cache.get(&reqs[1]).unwrap();
                    nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
                    nvfuser_ipc::host_p2p_recv_post(&hr, 256, T).unwrap();
                    nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
                    let want = (peer * 100 + t * 20 + step) as u8;
                    assert_eq!(first_byte(&recv), want, "thread {t} step {step}");
                }
            });
        }
    });
    let s = r.cache.stats();
    assert_eq!(s.exchanges, 80);
    assert_eq!(
        s.misses, 8,
        "only the first step of each thread misses: {s:?}"
    );
    r.finish();
}

/// Rank 1 leaves after one exchange; rank 0's next exchange must fail fast naming it.
fn peer_exit(r: Rank) {
    let peer = 1 - r.rank;
    let b = filled(64, 1);
    let req = if r.rank == 0 {
        Request::send(peer, "bye", b.addr(), 64, MemKind::Host)
    } else {
        Request::recv(peer, "bye", b.addr(), 64, MemKind::Host)
    };
    r.cache
        .exchange_handles(std::slice::from_ref(&req))
        .unwrap();
    if r.rank == 1 {
        drop(b);
        r.finish();
        return;
    }
    let start = Instant::now();
    let err = r
        .cache
        .exchange_handles_timeout(&[req], Duration::from_secs(15))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5), "{err}");
    // Rank 1 waits in its close for rank 0 to close, so rank 0 sees it closed (or exited).
    assert!(
        err.message.contains("closed its cache")
            || err.message.contains("exited")
            || err.message.contains("does not exist"),
        "{err}"
    );
    assert!(err.message.contains("peer rank 1"), "{err}");
    drop(b);
    r.finish();
}

/// Measures the cost of an exchange of two requests that hit on both sides (printed, not
/// asserted: timing depends on the machine) and checks it does no store traffic.
fn warm(r: Rank) {
    // Fewer calls in debug builds, where the numbers mean little anyway.
    let calls: u32 = if cfg!(debug_assertions) {
        1_000
    } else {
        20_000
    };
    let peer = 1 - r.rank;
    let a = filled(64, 0);
    let b = filled(64, 0);
    let reqs = [
        Request::send(peer, "w", a.addr(), 64, MemKind::Host),
        Request::recv(peer, "w", b.addr(), 64, MemKind::Host),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    let before = r.cache.stats();
    let start = Instant::now();
    for _ in 0..calls {
        r.cache.exchange_handles(&reqs).unwrap();
    }
    let per_call = start.elapsed() / calls;
    let after = r.cache.stats();
    assert_eq!(after.store_round_trips, before.store_round_trips);
    assert_eq!(after.hits - before.hits, 2 * u64::from(calls));
    // Own cost without waiting: rank 0 lets rank 1 arrive first (a busy pause outside the timed
    // region), so rank 0's call finds the peer's step already published.
    let own_calls = calls / 4;
    let mut own = Duration::ZERO;
    for _ in 0..own_calls {
        if r.rank == 0 {
            let pause = Instant::now();
            while pause.elapsed() < Duration::from_micros(30) {
                std::hint::spin_loop();
            }
        }
        let start = Instant::now();
        r.cache.exchange_handles(&reqs).unwrap();
        own += start.elapsed();
    }
    let start = Instant::now();
    for _ in 0..calls {
        std::hint::black_box(r.cache.get(&reqs[0]).unwrap());
    }
    let per_get = start.elapsed() / calls;
    println!(
        "warm: exchange_handles with 2 hits: {per_call:?}/call in lockstep; get: {per_get:?}/call"
    );
    if r.rank == 0 {
        println!(
            "warm: exchange_handles with 2 hits, peer already arrived: {:?}/call",
            own / own_calls
        );
    }
    r.finish();
}

/// Both ranks send device buffers to each other with the device get-zcopy primitives; rank 0
/// replaces its send buffer every other step.
fn device(r: Rank) {
    use device_buffer::{DeviceBuffer, DeviceStream};
    use nvfuser_ipc::{
        cuda_p2p_recv_post as channel_recv_post, cuda_p2p_send_post as channel_send_post,
        cuda_p2p_send_wait as channel_send_wait,
    };
    const N: u64 = 1 << 16;
    let peer = 1 - r.rank;
    let stream = DeviceStream::new().unwrap();
    let recv = DeviceBuffer::alloc(N).unwrap();
    let mut sends = vec![DeviceBuffer::alloc(N).unwrap()];
    for step in 0..6usize {
        if r.rank == 0 && step % 2 == 0 && step > 0 {
            sends.push(DeviceBuffer::alloc(N).unwrap());
        }
        let send = sends.last().unwrap();
        let value = (step * 2 + r.rank + 1) as u8;
        send.write(0, &vec![value; N as usize]).unwrap();
        let reqs = [
            Request::send(peer, "dev", send.addr(), N, MemKind::Device),
            Request::recv(peer, "dev", recv.addr(), N, MemKind::Device),
        ];
        r.cache.exchange_handles(&reqs).unwrap();
        let hs = r.cache.get(&reqs[0]).unwrap();
        let hr = r.cache.get(&reqs[1]).unwrap();
        channel_send_post(&hs, stream.stream()).unwrap();
        channel_recv_post(&hr, N, stream.stream()).unwrap();
        channel_send_wait(&hs, stream.stream()).unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u8; N as usize];
        recv.read(0, &mut got).unwrap();
        let want = (step * 2 + peer + 1) as u8;
        assert!(
            got.iter().all(|&b| b == want),
            "rank {} step {step}",
            r.rank
        );
    }
    println!("device: rank {} stats {:?}", r.rank, r.cache.stats());
    // No barrier: every transfer completed on both sides (each send_wait saw the peer's last
    // write), and the close returns only once the peer has closed its mappings of this rank's
    // memory, so the buffers may be freed right after it.
    let device = r.cache.transport(MemKind::Device).unwrap().clone();
    r.finish();
    assert_eq!(device.live_mappings(), 0);
    drop(sends);
    drop(recv);
}

/// The same exchange through the C ABI: context, cache, host buffers, requests, stats, the host
/// primitives and argument errors.
fn symmetric(r: Rank) {
    use nvfuser_ipc::ffi::context::{nvfipc_context, nvfipc_context_connect, nvfipc_context_free};
    use nvfuser_ipc::ffi::exchange::*;
    use nvfuser_ipc::ffi::host::*;
    use nvfuser_ipc::ffi::symmetric::nvfipc_symmetric_rendezvous;
    use std::ffi::{c_void, CString};
    use std::ptr::{null, null_mut};
    const BYTES: u64 = 8192;
    let (rank, world) = (r.rank, r.world);
    drop(r.cache); // built through the C ABI here
    let port = env_usize("NVFIPC_T_PORT") as u16;
    let host = CString::new("127.0.0.1").unwrap();
    let mut ctx: *mut nvfipc_context = null_mut();
    let st = nvfipc_context_connect(
        rank as i64,
        world as i64,
        host.as_ptr(),
        port,
        false,
        20_000,
        &mut ctx,
    );
    assert_eq!(st, Status::Ok);
    let mut cache: *mut nvfipc_cache = null_mut();
    assert_eq!(nvfipc_cache_create(ctx, &mut cache), Status::Ok);
    let mut buf: *mut c_void = null_mut();
    assert_eq!(nvfipc_host_alloc(BYTES as usize, &mut buf), Status::Ok);
    // SAFETY: `buf` is a live BYTES-byte buffer from nvfipc_host_alloc.
    unsafe { std::ptr::write_bytes(buf as *mut u8, rank as u8 + 1, BYTES as usize) };
    let tag = CString::new("weights").unwrap();
    let mut ptrs = vec![0u64; world];
    let mut sizes = vec![0u64; world];
    let rendezvous = |tag: &CString, ranks: &[i64], ptrs: &mut [u64], sizes: *mut u64| {
        nvfipc_symmetric_rendezvous(
            cache,
            tag.as_ptr(),
            NVFIPC_MEM_HOST,
            buf as u64,
            BYTES,
            if ranks.is_empty() {
                null()
            } else {
                ranks.as_ptr()
            },
            ranks.len(),
            -1,
            ptrs.as_mut_ptr(),
            sizes,
            ptrs.len(),
        )
    };
    let check_peers = |ptrs: &[u64], members: &[usize]| {
        for (i, &m) in members.iter().enumerate() {
            // SAFETY: the rendezvous mapped member m's live BYTES-byte buffer at ptrs[i] (this
            // rank's own buffer for itself).
            let got = unsafe { std::slice::from_raw_parts(ptrs[i] as *const u8, BYTES as usize) };
            assert!(
                got.iter().all(|&b| b == m as u8 + 1),
                "rank {rank}: member {m}"
            );
        }
    };
    assert_eq!(
        rendezvous(&tag, &[], &mut ptrs, sizes.as_mut_ptr()),
        Status::Ok
    );
    assert_eq!(ptrs[rank], buf as u64);
    assert!(sizes.iter().all(|&b| b == BYTES), "{sizes:?}");
    check_peers(&ptrs, &(0..world).collect::<Vec<_>>());
    let mut before = nvfuser_ipc::CacheStats::default();
    assert_eq!(nvfipc_cache_stats(cache, &mut before), Status::Ok);
    // Again: a cache hit, same pointers, no store traffic.
    let mut again = vec![0u64; world];
    assert_eq!(rendezvous(&tag, &[], &mut again, null_mut()), Status::Ok);
    assert_eq!(again, ptrs);
    let mut after = nvfuser_ipc::CacheStats::default();
    assert_eq!(nvfipc_cache_stats(cache, &mut after), Status::Ok);
    assert_eq!(after.store_round_trips, before.store_round_trips);
    assert_eq!(after.opens, before.opens);
    // A pair of the world: ranks 1 and 3 never call, nobody waits for them.
    if rank == 0 || rank == 2 {
        let pair = CString::new("pair").unwrap();
        let mut two = [0u64; 2];
        assert_eq!(rendezvous(&pair, &[2, 0], &mut two, null_mut()), Status::Ok);
        check_peers(&two, &[0, 2]);
    }
    // Bad arguments: refused, nothing changed.
    let mut short = [0u64; 1];
    assert_eq!(
        rendezvous(&tag, &[], &mut short, null_mut()),
        Status::InvalidArgument
    );
    let others: Vec<i64> = (0..world as i64).filter(|&m| m != rank as i64).collect();
    assert_eq!(
        rendezvous(&tag, &others, &mut ptrs, null_mut()),
        Status::InvalidArgument
    );
    let empty = CString::new("").unwrap();
    assert_eq!(
        rendezvous(&empty, &[], &mut ptrs, null_mut()),
        Status::InvalidArgument
    );
    // Every rank is done with the others' buffers before any frees its cache.
    assert_eq!(
        world_barrier(ctx),
        Status::Ok,
        "rank {rank}: barrier before teardown"
    );
    assert_eq!(nvfipc_cache_free(cache), Status::Ok);
    assert_eq!(nvfipc_host_free(buf), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
}

fn world_barrier(ctx: *const nvfuser_ipc::ffi::context::nvfipc_context) -> Status {
    nvfuser_ipc::ffi::barrier::nvfipc_barrier(ctx, std::ptr::null(), 0, -1)
}

fn c_abi(r: Rank) {
    use nvfuser_ipc::ffi::context::{
        nvfipc_context, nvfipc_context_connect, nvfipc_context_free, nvfipc_context_job_id,
    };
    use nvfuser_ipc::ffi::exchange::*;
    use nvfuser_ipc::ffi::host::*;
    use std::ffi::{c_void, CString};
    use std::ptr::{null, null_mut};
    let (rank, peer) = (r.rank, 1 - r.rank);
    drop(r.cache); // this scenario builds its cache through the C ABI
    let port = env_usize("NVFIPC_T_PORT") as u16;
    let host = CString::new("127.0.0.1").unwrap();
    let mut ctx: *mut nvfipc_context = null_mut();
    let st = nvfipc_context_connect(rank as i64, 2, host.as_ptr(), port, false, 20_000, &mut ctx);
    assert_eq!(st, Status::Ok);
    let mut cache: *mut nvfipc_cache = null_mut();
    assert_eq!(nvfipc_cache_create(ctx, &mut cache), Status::Ok);
    let mut send: *mut c_void = null_mut();
    let mut recv: *mut c_void = null_mut();
    assert_eq!(nvfipc_host_alloc(4096, &mut send), Status::Ok);
    assert_eq!(nvfipc_host_alloc(4096, &mut recv), Status::Ok);
    let tag = CString::new("c-abi").unwrap();
    let request = |direction, ptr: *mut c_void| nvfipc_request {
        peer: peer as i64,
        direction,
        kind: NVFIPC_MEM_HOST,
        tag: tag.as_ptr(),
        ptr: ptr as u64,
        bytes: 4096,
    };
    let reqs = [
        request(NVFIPC_DIRECTION_SEND, send),
        request(NVFIPC_DIRECTION_RECV, recv),
    ];
    // Bad arguments fail cleanly and change nothing.
    assert_eq!(
        nvfipc_exchange_handles(cache, null(), 2),
        Status::InvalidArgument
    );
    let to_self = nvfipc_request {
        peer: rank as i64,
        ..reqs[0]
    };
    assert_eq!(
        nvfipc_exchange_handles(cache, &to_self, 1),
        Status::InvalidArgument
    );
    let mut stack = [0u8; 16];
    let foreign = nvfipc_request {
        ptr: stack.as_mut_ptr() as u64,
        bytes: 16,
        ..reqs[0]
    };
    assert_eq!(
        nvfipc_exchange_handles(cache, &foreign, 1),
        Status::InvalidArgument
    );
    for step in 0..3u8 {
        // SAFETY: `send` is a live 4096-byte buffer from nvfipc_host_alloc.
        unsafe { std::ptr::write_bytes(send as *mut u8, rank as u8 * 10 + step, 4096) };
        assert_eq!(nvfipc_exchange_handles(cache, reqs.as_ptr(), 2), Status::Ok);
        let mut h = nvfipc_p2p_handle::default();
        assert_eq!(nvfipc_cache_get(cache, &reqs[1], &mut h), Status::Ok);
        assert_eq!(h.local_ptr, recv as u64);
        assert_eq!(h.kind, NVFIPC_MEM_HOST);
        assert_eq!(nvfipc_host_p2p_send_post(cache, &reqs[0]), Status::Ok);
        assert_eq!(
            nvfipc_host_p2p_recv_post(cache, &reqs[1], 4096, -1),
            Status::Ok
        );
        assert_eq!(nvfipc_host_p2p_send_wait(cache, &reqs[0], -1), Status::Ok);
        // SAFETY: `recv` is a live 4096-byte buffer.
        let got = unsafe { std::slice::from_raw_parts(recv as *const u8, 4096) };
        assert!(
            got.iter().all(|&b| b == peer as u8 * 10 + step),
            "step {step}"
        );
    }
    let mut stats = nvfuser_ipc::CacheStats::default();
    assert_eq!(nvfipc_cache_stats(cache, &mut stats), Status::Ok);
    assert_eq!(
        (stats.exchanges, stats.misses, stats.hits),
        (3, 2, 4),
        "{stats:?}"
    );
    assert_eq!(stats.store_round_trips, 2);
    let mut job_ptr: *const std::ffi::c_char = null();
    assert_eq!(nvfipc_context_job_id(ctx, &mut job_ptr), Status::Ok);
    // SAFETY: the library returned a NUL-terminated string that lives as long as the context.
    let job = unsafe { std::ffi::CStr::from_ptr(job_ptr) }
        .to_string_lossy()
        .into_owned();
    println!("job-id:{}", job);
    assert_eq!(nvfipc_cache_free(cache), Status::Ok);
    assert_eq!(
        nvfipc_cache_free(cache),
        Status::InvalidState,
        "double free"
    );
    assert_eq!(nvfipc_host_free(send), Status::Ok);
    assert_eq!(
        nvfipc_host_free(send),
        Status::InvalidArgument,
        "double free"
    );
    assert_eq!(nvfipc_host_free(recv), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
}

/// Both ranks exchange a pair of host buffers. Rank 0 then closes first; rank 1 keeps using its
/// mapping of rank 0's buffer for 300 ms before it closes. Rank 0's close must not return before
/// rank 1 has started closing.
fn linger(r: Rank) {
    const HOLD: Duration = Duration::from_millis(300);
    let peer = 1 - r.rank;
    let send = filled(256, r.rank as u8 + 1);
    let recv = filled(256, 0);
    let reqs = [
        Request::send(peer, "hold", send.addr(), 256, MemKind::Host),
        Request::recv(peer, "hold", recv.addr(), 256, MemKind::Host),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    let store = test_store();
    let key = |k: &str| format!("{}/linger/{k}", r.job);
    if r.rank == 0 {
        let started = set_stamp(&store, &key("r0-closing"));
        let stats = r.cache.try_close().expect("rank 0's close");
        let returned = now_ns();
        assert_eq!(stats.opens, stats.closes, "{stats:?}");
        assert_eq!(stats.peers_unclosed, 0);
        // Rank 1 writes its stamp right before it closes: it must be there already.
        assert!(
            store.check(&[key("r1-closing").as_str()]).unwrap(),
            "rank 0's close returned before rank 1 started closing"
        );
        let peer_closing = stamp(&store, &key("r1-closing"));
        assert!(peer_closing <= returned, "{peer_closing} > {returned}");
        let waited = Duration::from_nanos(returned - started);
        assert!(waited >= HOLD - Duration::from_millis(50), "{waited:?}");
        println!("linger: rank 0's close waited {waited:?} for rank 1");
    } else {
        stamp(&store, &key("r0-closing"));
        // Rank 0 is closing: its buffer is still mapped here and must stay readable.
        let h = r.cache.get(&reqs[1]).unwrap();
        let until = Instant::now() + HOLD;
        while Instant::now() < until {
            assert_eq!(peer_bytes(&h, 256), vec![1u8; 256]);
            std::thread::sleep(Duration::from_millis(10));
        }
        set_stamp(&store, &key("r1-closing"));
        r.finish();
    }
}

/// Both ranks exchange; rank 0 then closes while rank 1 holds the mappings until the parent
/// kills it.
fn killed(r: Rank) {
    let peer = 1 - r.rank;
    let send = filled(256, r.rank as u8 + 1);
    let recv = filled(256, 0);
    let reqs = [
        Request::send(peer, "kill", send.addr(), 256, MemKind::Host),
        Request::recv(peer, "kill", recv.addr(), 256, MemKind::Host),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    let store = test_store();
    if r.rank == 0 {
        let started = set_stamp(&store, &format!("{}/r0-closing", r.job));
        let stats = r.cache.try_close().expect("rank 0's close");
        let returned = set_stamp(&store, &format!("{}/r0-closed", r.job));
        assert_eq!(stats.opens, stats.closes, "{stats:?}");
        assert_eq!((stats.peers_unclosed, stats.leaked_slabs), (0, 0));
        println!(
            "killed: rank 0's close took {:?}",
            Duration::from_nanos(returned - started)
        );
    } else {
        // Hold rank 0's memory until killed; the parent kills within a second.
        std::thread::sleep(T);
        panic!("rank 1 was not killed");
    }
}

/// Both ranks exchange once, then wait in an exchange the other never matches while the parent
/// truncates rank 0's board: each must fail with an error naming the truncated board, well
/// before its timeout, and both close and exit normally.
fn truncated(r: Rank) {
    let peer = 1 - r.rank;
    let send = filled(256, r.rank as u8 + 1);
    let recv = filled(256, 0);
    let reqs = [
        Request::send(peer, "warm", send.addr(), 256, MemKind::Host),
        Request::recv(peer, "warm", recv.addr(), 256, MemKind::Host),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    assert_eq!(first_byte(&recv), 0);
    let store = test_store();
    let other = filled(64, 9);
    let lonely = Request::send(
        peer,
        format!("only{}", r.rank),
        other.addr(),
        64,
        MemKind::Host,
    );
    set_stamp(&store, &format!("{}/r{}-waiting", r.job, r.rank));
    let start = Instant::now();
    let err = r
        .cache
        .exchange_handles_timeout(&[lonely], Duration::from_secs(15))
        .unwrap_err();
    set_stamp(&store, &format!("{}/r{}-failed", r.job, r.rank));
    println!("the error: {err}");
    assert_eq!(err.status, Status::Protocol, "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "{err}");
    let board = names::CacheNames::new(&r.job, "", 1).board(0);
    for needle in [board.as_str(), "truncated or shrunk", "create new ones"] {
        assert!(err.message.contains(needle), "{needle:?}: {err}");
    }
    let whose = if r.rank == 0 {
        "this rank's own board"
    } else {
        "the board of peer rank 0"
    };
    assert!(err.message.contains(whose), "{whose:?}: {err}");
    // Closing still works; rank 0's `closed` flag is lost with its board, so rank 1 may wait
    // for it until rank 0 exits, at most the linger.
    r.cache.set_linger(Duration::from_secs(2));
    let stats = r.cache.close();
    assert_eq!(stats.opens, stats.closes, "{stats:?}");
    println!("rank {} survived", r.rank);
}

/// Where a pool step puts this rank's buffer: (segment, offset), 256-byte aligned, never the
/// place of the step before in the same segment.
fn pool_place(step: usize) -> (usize, u64) {
    (step % 3, ((step * 7) % 16) as u64 * 256)
}

/// Fills `len` bytes at `offset` of `seg` with what `rank` writes at `step`.
fn pool_fill(seg: &HostBuffer, offset: u64, len: usize, rank: usize, step: usize) -> Vec<u8> {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (rank * 101 + step * 13 + i) as u8)
        .collect();
    seg.write(offset, &bytes).unwrap();
    bytes
}

/// One pool call: this rank sends from and receives into fresh buffers at `(seg, offset)`,
/// then reads what the peer wrote for this step through its mapping.
fn pool_step(r: &Rank, tag: &str, segs: &[HostBuffer], seg: usize, offset: u64, step: usize) {
    const LEN: usize = 256;
    let peer = 1 - r.rank;
    // Sends from the first half of the segment, receives into the second.
    let half = segs[seg].len() / 2;
    pool_fill(&segs[seg], offset, LEN, r.rank, step);
    pool_fill(&segs[seg], half + offset, LEN, r.rank + 10, step);
    let reqs = [
        Request::send(
            peer,
            tag,
            segs[seg].addr() + offset,
            LEN as u64,
            MemKind::Host,
        ),
        Request::recv(
            peer,
            tag,
            segs[seg].addr() + half + offset,
            LEN as u64,
            MemKind::Host,
        ),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    // The send channel maps the peer's receive buffer, and the other way round.
    let want_recv: Vec<u8> = (0..LEN)
        .map(|i| ((peer + 10) * 101 + step * 13 + i) as u8)
        .collect();
    let want_send: Vec<u8> = (0..LEN)
        .map(|i| (peer * 101 + step * 13 + i) as u8)
        .collect();
    let got_send = peer_bytes(&r.cache.get(&reqs[0]).unwrap(), LEN);
    let got_recv = peer_bytes(&r.cache.get(&reqs[1]).unwrap(), LEN);
    assert_eq!(
        got_send, want_recv,
        "rank {} step {step}: peer's receive buffer",
        r.rank
    );
    assert_eq!(
        got_recv, want_send,
        "rank {} step {step}: peer's send buffer",
        r.rank
    );
}

/// The caching-allocator pattern: every call's buffers are new but carved from allocations the
/// peer imported before, so after the first call per allocation no call makes a store round
/// trip, and every call moves the right bytes. Then, with no replaced mapping kept, an
/// allocation the peer released goes through the store again, still right.
fn pool(r: Rank) {
    let store = test_store();
    // Both ranks past this point (on a store connection of the test's own).
    let sync = |what: &str| {
        set_stamp(&store, &format!("{}/pool-{what}-{}", r.job, r.rank));
        stamp(&store, &format!("{}/pool-{what}-{}", r.job, 1 - r.rank));
    };
    let segs: Vec<HostBuffer> = (0..3).map(|_| filled(16 * 1024, 0)).collect();
    for step in 0..3 {
        pool_step(&r, "pool", &segs, step, 0, step);
    }
    // Every rank has imported every segment of its peer: nothing goes through the store now.
    sync("warm");
    let before = r.cache.stats();
    for step in 3..30 {
        let (seg, offset) = pool_place(step);
        pool_step(&r, "pool", &segs, seg, offset, step);
    }
    let after = r.cache.stats();
    assert_eq!(
        after.store_round_trips, before.store_round_trips,
        "rank {}: {before:?} -> {after:?}",
        r.rank
    );
    assert!(
        after.records_known >= before.records_known + 2 * 27,
        "{after:?}"
    );
    assert_eq!(after.exchanges, before.exchanges + 27);

    // No replaced mapping kept: a released allocation is no longer "known" to the peer.
    r.cache.set_retained_per_peer(0);
    let fresh: Vec<HostBuffer> = (0..2).map(|_| filled(16 * 1024, 0)).collect();
    let trips = |r: &Rank| r.cache.stats().store_round_trips;
    // The barriers let each importer finish its call (and its releases) before the next one.
    let t0 = trips(&r);
    pool_step(&r, "released", &fresh, 0, 0, 100);
    sync("r0");
    let t1 = trips(&r);
    assert!(t1 > t0, "a new allocation goes through the store");
    pool_step(&r, "released", &fresh, 0, 512, 101);
    sync("r1");
    let t2 = trips(&r);
    assert_eq!(t2, t1, "the same allocation, still mapped: board only");
    pool_step(&r, "released", &fresh, 1, 0, 102);
    sync("r2");
    // The importer released its mapping of fresh[0] (nothing kept).
    let t3 = trips(&r);
    pool_step(&r, "released", &fresh, 0, 1024, 103);
    sync("r3");
    let t4 = trips(&r);
    assert!(
        t4 > t3,
        "rank {}: a released allocation goes through the store again",
        r.rank
    );
    drop(store);
    r.finish();
}

/// Rank 0 exchanges once, then waits for a step rank 1 never takes; the parent kills rank 1
/// while rank 0 is blocked.
fn killed_wait(r: Rank) {
    let peer = 1 - r.rank;
    let send = filled(256, r.rank as u8 + 1);
    let recv = filled(256, 0);
    let reqs = [
        Request::send(peer, "kw", send.addr(), 256, MemKind::Host),
        Request::recv(peer, "kw", recv.addr(), 256, MemKind::Host),
    ];
    r.cache.exchange_handles(&reqs).unwrap();
    if r.rank == 1 {
        // Killed by the parent within a second.
        std::thread::sleep(T);
        panic!("rank 1 was not killed");
    }
    let store = test_store();
    set_stamp(&store, &format!("{}/r0-waiting", r.job));
    let timeout = Duration::from_secs(20);
    let start = Instant::now();
    let err = r
        .cache
        .exchange_handles_timeout(&reqs, timeout)
        .unwrap_err();
    assert!(start.elapsed() < timeout, "{err}");
    assert_ne!(err.status, Status::Timeout, "{err}");
    assert!(err.message.contains("peer rank 1"), "{err}");
    assert!(err.message.contains("exited"), "{err}");
    let stats = r.cache.try_close().expect("rank 0's close");
    assert_eq!(stats.opens, stats.closes, "{stats:?}");
}
