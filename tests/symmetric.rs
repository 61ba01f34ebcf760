//! Contiguous views and releases of symmetric allocations across real processes, over host
//! buffers (the view of device buffers is checked on GPU machines, `tests/gpu/`).
//!
//! Each test starts a store server in the test process and re-executes this test binary once per
//! rank, running the ignored `child` test with the scenario, rank, world size, port and job id in
//! the environment.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::HostBuffer;
use nvfuser_ipc::Status;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{env_usize, jitter, Ranks};

const ROLE: &str = "NVFIPC_SYMMETRIC_CHILD";
const T: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------------

/// Starts `world` ranks of `scenario` and asserts that every one succeeds.
fn assert_all_ok(scenario: &str, world: usize) {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    // Tests run in parallel threads of one process: the world size tells apart the runs of one
    // scenario.
    let job = format!(
        "s{}{world}x{}",
        scenario
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(6)
            .collect::<String>(),
        std::process::id() % 100_000
    );
    let failed: Vec<String> = Ranks::spawn(ROLE, scenario, world, server.port(), &job)
        .collect(Duration::from_secs(60))
        .into_iter()
        .enumerate()
        .filter(|(_, (ok, _))| !ok)
        .map(|(rank, (_, out))| format!("--- rank {rank}:\n{out}"))
        .collect();
    server.shutdown();
    assert!(
        failed.is_empty(),
        "{scenario}: ranks failed:\n{}",
        failed.join("\n")
    );
}

/// Every member writes its pattern through its own buffer and reads every member's through the
/// view; releases and rendezvous again, with the same buffers and with others, in orders that
/// differ from rank to rank; nothing stays mapped after a release.
#[test]
fn view_release_and_rendezvous_again_at_2() {
    assert_all_ok("cycles", 2);
}

#[test]
fn view_release_and_rendezvous_again_at_4() {
    assert_all_ok("cycles", 4);
}

/// Groups of a part of the world (and of one rank) get views of their own members only.
#[test]
fn views_of_subsets() {
    assert_all_ok("subsets", 4);
}

/// Buffers of different sizes or offsets are refused with the members named; unknown tags and
/// second releases are refused; the C ABI says the same.
#[test]
fn mismatches_and_unknown_tags_are_named() {
    assert_all_ok("mismatch", 3);
}

#[test]
fn through_the_c_abi() {
    assert_all_ok("c_abi", 2);
}

/// A member that dies (SIGKILL) mid-rendezvous, after its own call timed out: the others get an
/// error naming it as soon as they see its process gone (not at their timeout), and close their
/// caches cleanly.
#[test]
fn a_member_that_dies_is_named_at_once() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = format!("sdies3x{}", std::process::id() % 100_000);
    let got = Ranks::spawn(ROLE, "dies", 3, server.port(), &job).collect(Duration::from_secs(60));
    server.shutdown();
    let report: String = got
        .iter()
        .enumerate()
        .map(|(rank, (ok, out))| format!("--- rank {rank} (ok: {ok}):\n{out}\n"))
        .collect();
    assert!(got[0].0 && got[1].0, "survivors failed:\n{report}");
    assert!(!got[2].0, "rank 2 should have died:\n{report}");
    assert!(got[2].1.contains(DYING), "rank 2 died elsewhere:\n{report}");
}

// ------------------------------------------------------------------------------------------------
// Rank side
// ------------------------------------------------------------------------------------------------

struct Rank {
    rank: usize,
    world: usize,
    job: String,
    store: TcpStore,
    cache: HandleCache,
}

fn connect() -> TcpStore {
    TcpStore::connect(
        "127.0.0.1",
        env_usize("NVFIPC_T_PORT") as u16,
        &ConnectOptions::with_timeout(T),
    )
    .expect("connect to the store")
}

impl Rank {
    fn from_env() -> Rank {
        let rank = env_usize("NVFIPC_T_RANK");
        let world = env_usize("NVFIPC_T_WORLD");
        let job = std::env::var("NVFIPC_T_JOB").expect("job id");
        nvfuser_ipc::tools::host::set_default_job(&job);
        let cache = nvfuser_ipc::default_cache(CacheConfig {
            rank,
            world_size: world,
            store: Arc::new(connect()),
            job_id: job.clone(),
            scope: String::new(),
            timeout: T,
        })
        .expect("cache");
        Rank {
            rank,
            world,
            job,
            store: connect(),
            cache,
        }
    }

    /// Waits until every rank of `members` has reached the point `name` (store keys).
    fn barrier(&self, name: &str, members: &[usize]) {
        let key = |r: usize| format!("{}/{name}/{r}", self.job);
        self.store.set(&key(self.rank), b"1").unwrap();
        for &m in members {
            self.store
                .get(&key(m), T)
                .unwrap_or_else(|e| panic!("rank {}: barrier {name}: {e}", self.rank));
        }
    }

    fn world(&self) -> Vec<usize> {
        (0..self.world).collect()
    }

    /// Peers' buffers mapped by the host transport of the cache.
    fn live_mappings(&self) -> usize {
        self.cache
            .transport(MemKind::Host)
            .map_or(0, |t| t.live_mappings())
    }

    /// Mappings of this job's host files in this process (buffers, views, slabs).
    fn mapped_files(&self) -> usize {
        let prefix = nvfuser_ipc::tools::host::job_prefix(&self.job);
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&prefix))
            .count()
    }

    fn finish(self, members: &[usize]) {
        self.barrier("finish", members);
        let stats = self.cache.try_close().expect("close");
        assert_eq!(stats.opens, stats.closes, "rank {}: {stats:?}", self.rank);
    }
}

#[test]
#[ignore = "a rank process started by the tests above"]
fn child() {
    let Ok(scenario) = std::env::var(ROLE) else {
        return;
    };
    let r = Rank::from_env();
    match scenario.as_str() {
        "cycles" => cycles(r),
        "subsets" => subsets(r),
        "mismatch" => mismatch(r),
        "c_abi" => c_abi(r),
        "dies" => dies(r),
        other => panic!("unknown scenario {other}"),
    }
}

/// A byte that tells member, step and place apart.
fn pattern(member: usize, step: usize, i: u64) -> u8 {
    (member as u64 * 31 + step as u64 * 7 + i % 251) as u8
}

/// Writes this rank's pattern of `step` into `bytes` bytes at `ptr` (its own buffer).
fn write_own(ptr: u64, bytes: u64, rank: usize, step: usize) {
    // SAFETY: [ptr, + bytes) is this rank's live host buffer.
    let own = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, bytes as usize) };
    for (i, b) in own.iter_mut().enumerate() {
        *b = pattern(rank, step, i as u64);
    }
}

/// Checks every member's pattern of `step` through the view.
fn check_view(rank: usize, members: &[usize], base: u64, stride: u64, bytes: u64, step: usize) {
    for (i, &m) in members.iter().enumerate() {
        let at = base + i as u64 * stride;
        // SAFETY: the view maps member m's live buffer of `bytes` bytes at `at`.
        let got = unsafe { std::slice::from_raw_parts(at as *const u8, bytes as usize) };
        if let Some(bad) = (0..bytes).find(|&j| got[j as usize] != pattern(m, step, j)) {
            panic!(
                "rank {rank}, step {step}: member {m} (slot {i}) byte {bad} reads {} through the \
                 view, expected {}",
                got[bad as usize],
                pattern(m, step, bad)
            );
        }
    }
}

/// One rendezvous of `tag` over `members` with `bytes` bytes at `offset` of `buf`, its view
/// checked (a write through the own buffer is read by every member through its view, and a
/// write through the view reaches the member's buffer), then released in this rank's order.
fn cycle(
    r: &Rank,
    tag: &str,
    members: &[usize],
    buf: &HostBuffer,
    offset: u64,
    bytes: u64,
    step: usize,
) {
    let ptr = buf.addr() + offset;
    jitter(r.rank, step, 3000);
    let peers = r
        .cache
        .symmetric_rendezvous(tag, ptr, bytes, MemKind::Host, Some(members), T)
        .unwrap_or_else(|e| panic!("rank {}, step {step}: rendezvous: {e}", r.rank));
    assert_eq!(peers.len(), members.len());
    let (base, stride) = r.cache.symmetric_contiguous_view(tag).unwrap();
    assert_eq!(
        r.cache.symmetric_contiguous_view(tag).unwrap(),
        (base, stride),
        "a second call returns the same view"
    );
    let page = 4096;
    assert_eq!(stride % page, 0, "whole pages");
    assert!(stride >= bytes + offset % page);
    assert_eq!(base % page, offset % page, "the buffer's place in its page");
    let me = members.iter().position(|&m| m == r.rank).unwrap();
    write_own(ptr, bytes, r.rank, step);
    r.barrier(&format!("{tag}/{step}/written"), members);
    check_view(r.rank, members, base, stride, bytes, step);
    r.barrier(&format!("{tag}/{step}/read"), members);
    // Through the view into the next member's buffer: it reads it in its own.
    let next = (me + 1) % members.len();
    let mark = 0xA0 | step as u8;
    // SAFETY: slot `next` of the view maps that member's live buffer, `bytes` long.
    unsafe { *((base + next as u64 * stride + bytes - 1) as *mut u8) = mark };
    r.barrier(&format!("{tag}/{step}/marked"), members);
    // SAFETY: [ptr, + bytes) is this rank's live buffer.
    let last = unsafe { *((ptr + bytes - 1) as *const u8) };
    if members.len() > 1 || next == me {
        assert_eq!(last, mark, "rank {}: the previous member's write", r.rank);
    }
    r.barrier(&format!("{tag}/{step}/checked"), members);
    jitter(r.rank, step + 17, 3000);
    r.cache.symmetric_release(tag).unwrap();
    assert_eq!(r.cache.symmetric_views(), 0);
}

fn cycles(r: Rank) {
    let members = r.world();
    let page = 4096u64;
    // Step 0: buffers of 2 pages + 100 bytes, 24 bytes into their allocation.
    let a = nvfuser_ipc::host_alloc(4 * page).unwrap();
    let b = nvfuser_ipc::host_alloc(4 * page).unwrap();
    let c = nvfuser_ipc::host_alloc(8 * page).unwrap();
    cycle(&r, "w", &members, &a, 24, 2 * page + 100, 0);
    assert_eq!(r.live_mappings(), 0, "released");
    let baseline = r.mapped_files();
    let opens = r.cache.stats().opens;
    // Step 1: the same buffers again: re-imported from the kept records, no store fetch.
    let fetched = r.cache.stats().records_received;
    cycle(&r, "w", &members, &a, 24, 2 * page + 100, 1);
    assert_eq!(r.cache.stats().records_received, fetched, "kept records");
    assert_eq!(
        r.cache.stats().opens,
        opens + members.len() as u64 - 1,
        "each peer opened again"
    );
    assert_eq!((r.live_mappings(), r.mapped_files()), (0, baseline));
    // Steps 2-5: some ranks move to other buffers, then all do, at another offset and size.
    for step in 2..6 {
        let (buf, offset, bytes) = match step {
            2 | 3 if r.rank % 2 == 0 => (&b, 24, 2 * page + 100),
            2 | 3 => (&a, 24, 2 * page + 100),
            _ => (&c, page + 512, 5 * page),
        };
        cycle(&r, "w", &members, buf, offset, bytes, step);
        assert_eq!(
            (r.live_mappings(), r.mapped_files()),
            (0, baseline),
            "rank {}, step {step}: nothing left mapped",
            r.rank
        );
    }
    r.finish(&members);
}

fn subsets(r: Rank) {
    let page = 4096u64;
    let buf = nvfuser_ipc::host_alloc(2 * page).unwrap();
    // Two disjoint pairs at the same time, each with its own size.
    let pair: Vec<usize> = if r.rank % 2 == 0 {
        vec![0, 2]
    } else {
        vec![1, 3]
    };
    let bytes = if r.rank % 2 == 0 { 1000 } else { page + 8 };
    cycle(&r, "pair", &pair, &buf, 0, bytes, 0);
    // A group of one: a view of this rank's own buffer.
    let alone = [r.rank];
    r.cache
        .symmetric_rendezvous("alone", buf.addr() + 8, 64, MemKind::Host, Some(&alone), T)
        .unwrap();
    let (base, stride) = r.cache.symmetric_contiguous_view("alone").unwrap();
    assert_eq!((base % page, stride), (8, page));
    write_own(buf.addr() + 8, 64, r.rank, 9);
    check_view(r.rank, &alone, base, stride, 64, 9);
    r.cache.symmetric_release("alone").unwrap();
    // Three of the four; rank 3 takes no part.
    let three = [0, 1, 2];
    if r.rank != 3 {
        cycle(&r, "three", &three, &buf, 100, page, 1);
    }
    assert_eq!(r.live_mappings(), 0);
    let all = r.world();
    r.finish(&all);
}

/// What rank 2 of `dies` prints just before it kills itself.
const DYING: &str = "rank 2: timed out as expected, now dying";

fn dies(r: Rank) {
    let buf = nvfuser_ipc::host_alloc(4096).unwrap();
    let members = [0, 1, 2];
    if r.rank == 2 {
        // Publishes its record, times out (the others come later), then dies for real.
        let err = r
            .cache
            .symmetric_rendezvous(
                "dies",
                buf.addr(),
                64,
                MemKind::Host,
                Some(&members),
                Duration::from_millis(300),
            )
            .unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
        println!("{DYING}");
        // SAFETY: kill(2) on this process; nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL");
    }
    std::thread::sleep(Duration::from_secs(1));
    let limit = Duration::from_secs(5);
    let started = std::time::Instant::now();
    let err = r
        .cache
        .symmetric_rendezvous("dies", buf.addr(), 64, MemKind::Host, Some(&members), limit)
        .unwrap_err();
    let took = started.elapsed();
    println!(
        "rank {}: {:?} after {took:?}: {}",
        r.rank, err.status, err.message
    );
    // Its death is seen (its pid, as its cache published it), not waited out.
    assert!(took < limit / 2, "took {took:?}: {err}");
    assert!(
        err.message.contains("rank 2") && err.message.contains("exited"),
        "{err}"
    );
    r.finish(&[0, 1]);
}

fn mismatch(r: Rank) {
    let page = 4096u64;
    let members = r.world();
    let buf = nvfuser_ipc::host_alloc(4 * page).unwrap();
    // Rank 2's buffer is twice as large.
    let bytes = if r.rank == 2 { 2 * page } else { page };
    r.cache
        .symmetric_rendezvous("sizes", buf.addr(), bytes, MemKind::Host, None, T)
        .unwrap();
    let err = r.cache.symmetric_contiguous_view("sizes").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(
        err.message.contains("ranks 0, 1: 4096; rank 2: 8192"),
        "{err}"
    );
    assert_eq!(r.cache.symmetric_views(), 0);
    r.cache.symmetric_release("sizes").unwrap();
    // Rank 1's buffer lies 64 bytes further into its page.
    let offset = if r.rank == 1 { 64 } else { 0 };
    r.cache
        .symmetric_rendezvous("offsets", buf.addr() + offset, page, MemKind::Host, None, T)
        .unwrap();
    let err = r.cache.symmetric_contiguous_view("offsets").unwrap_err();
    assert!(err.message.contains("ranks 0, 2: 0; rank 1: 64"), "{err}");
    r.cache.symmetric_release("offsets").unwrap();
    // Unknown tags, second releases.
    for tag in ["never", "offsets"] {
        let err = r.cache.symmetric_release(tag).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains("was not rendezvoused"), "{err}");
        let err = r.cache.symmetric_contiguous_view(tag).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
    }
    assert_eq!(r.live_mappings(), 0);
    r.finish(&members);
}

/// The C ABI: rendezvous, view, release, rendezvous again, and its argument errors.
fn c_abi(r: Rank) {
    use nvfuser_ipc::ffi::context::{nvfipc_context, nvfipc_context_connect, nvfipc_context_free};
    use nvfuser_ipc::ffi::exchange::{nvfipc_cache, nvfipc_cache_create, nvfipc_cache_free};
    use nvfuser_ipc::ffi::host::{nvfipc_host_alloc, nvfipc_host_free};
    use nvfuser_ipc::ffi::symmetric::*;
    use std::ffi::{c_void, CString};
    use std::ptr::{null, null_mut};
    const BYTES: u64 = 6000;
    let (rank, world) = (r.rank, r.world);
    drop(r.cache); // built through the C ABI here
    let host = CString::new("127.0.0.1").unwrap();
    let mut ctx: *mut nvfipc_context = null_mut();
    let port = env_usize("NVFIPC_T_PORT") as u16;
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
    let barrier = || {
        let st = nvfuser_ipc::ffi::barrier::nvfipc_barrier(ctx, null(), 0, -1);
        assert_eq!(st, Status::Ok, "rank {rank}: barrier");
    };
    let tag = CString::new("table").unwrap();
    let members: Vec<usize> = (0..world).collect();
    let mut buffers = Vec::new();
    for step in 0..3 {
        let mut buf: *mut c_void = null_mut();
        assert_eq!(nvfipc_host_alloc(BYTES as usize, &mut buf), Status::Ok);
        buffers.push(buf);
        let mut ptrs = vec![0u64; world];
        let st = nvfipc_symmetric_rendezvous(
            cache,
            tag.as_ptr(),
            nvfuser_ipc::ffi::exchange::NVFIPC_MEM_HOST,
            buf as u64,
            BYTES,
            null(),
            0,
            -1,
            ptrs.as_mut_ptr(),
            null_mut(),
            world,
        );
        assert_eq!(st, Status::Ok, "{}", last_error());
        let (mut base, mut stride) = (0u64, 0u64);
        let st = nvfipc_symmetric_contiguous_view(cache, tag.as_ptr(), &mut base, &mut stride);
        assert_eq!(st, Status::Ok, "{}", last_error());
        assert_eq!(stride, 8192);
        write_own(buf as u64, BYTES, rank, step);
        barrier();
        check_view(rank, &members, base, stride, BYTES, step);
        barrier();
        assert_eq!(nvfipc_symmetric_release(cache, tag.as_ptr()), Status::Ok);
    }
    let never = CString::new("never").unwrap();
    assert_eq!(
        nvfipc_symmetric_release(cache, never.as_ptr()),
        Status::InvalidArgument
    );
    let message = last_error();
    assert!(
        message.contains("\"never\" was not rendezvoused"),
        "{message}"
    );
    assert!(message.contains("nvfipc_symmetric_release"), "{message}");
    let (mut base, mut stride) = (0u64, 0u64);
    assert_eq!(
        nvfipc_symmetric_contiguous_view(cache, never.as_ptr(), &mut base, &mut stride),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_symmetric_contiguous_view(cache, tag.as_ptr(), null_mut(), &mut stride),
        Status::InvalidArgument
    );
    assert!(last_error().contains("out_base"), "{}", last_error());
    assert_eq!(
        nvfipc_symmetric_release(cache, null()),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_symmetric_release(null(), tag.as_ptr()),
        Status::InvalidArgument
    );
    barrier();
    assert_eq!(nvfipc_cache_free(cache), Status::Ok);
    for buf in buffers {
        assert_eq!(nvfipc_host_free(buf), Status::Ok);
    }
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local message valid until the next
    // call on this thread.
    unsafe { std::ffi::CStr::from_ptr(nvfuser_ipc::ffi::boundary::nvfipc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}
