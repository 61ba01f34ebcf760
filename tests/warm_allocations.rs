//! A warm exchange allocates nothing, in the whole process: two rank processes exchange buffers
//! through the C ABI (context, cache, requests, `nvfipc_exchange_handles`), and a counting global
//! allocator sees every allocation of every thread of the rank (the library's background threads,
//! its waits for a peer that is behind, the C boundary) while the ranks run warm calls. One rank
//! falls behind now and then, so the other waits for it inside the call. Host buffers everywhere;
//! on a machine with a CUDA device also `cuMemAlloc` buffers and VMM buffers that span two
//! physical allocations (PyTorch's expandable segments), whose cached resolve is the driver's
//! short proof that the buffer is unchanged (skipped, saying so, without a device).
//!
//! `NVFIPC_T_TRACE_ALLOCS=N` prints where the first N allocations of the warm window were made.

mod common;

use common::{env_usize, Ranks};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_char, c_void, CString};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

// The library's C symbols are linked into this binary and called only through `extern "C"`; its
// `tools` give the device memory the device ranks exchange.
use nvfuser_ipc::tools::cuda::{driver, result};

/// Every allocation of the process, counted while `COUNTING` is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static TRACES_LEFT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread prints a trace, whose own allocations are not counted.
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

fn counted(size: usize) {
    if !COUNTING.load(Ordering::Relaxed) || TRACING.with(Cell::get) {
        return;
    }
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let wants_trace = TRACES_LEFT
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    if wants_trace {
        TRACING.with(|t| t.set(true));
        // One line per allocation: the library's own frames, innermost first.
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let ours: Vec<&str> = trace
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("nvfuser_ipc::") || l.contains("nvfipc_store::"))
            .map(|l| l.split_once(": ").map_or(l, |(_, f)| f))
            .take(4)
            .collect();
        eprintln!(
            "allocation of {size} bytes in a warm call: {}",
            ours.join(" <- ")
        );
        TRACING.with(|t| t.set(false));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator's contract is `System`'s; counting touches only atomics and a thread-local `Cell`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(new_size);
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, which is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, which is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[repr(C)]
struct Opaque {
    _private: [u8; 0],
}

/// `nvfipc_request` of include/nvfuser_ipc.h.
#[repr(C)]
struct CRequest {
    peer: i64,
    direction: i32,
    kind: i32,
    tag: *const c_char,
    ptr: u64,
    bytes: u64,
}

const OK: i32 = 0;
const SEND: i32 = 0;
const RECV: i32 = 1;
const HOST: i32 = 1;
const DEVICE: i32 = 0;

extern "C" {
    fn nvfipc_context_connect(
        rank: i64,
        world_size: i64,
        host: *const c_char,
        port: u16,
        host_store: bool,
        timeout_ms: i64,
        out_ctx: *mut *mut Opaque,
    ) -> i32;
    fn nvfipc_context_free(ctx: *mut Opaque) -> i32;
    fn nvfipc_cache_create(ctx: *const Opaque, out_cache: *mut *mut Opaque) -> i32;
    fn nvfipc_cache_free(cache: *mut Opaque) -> i32;
    fn nvfipc_exchange_handles(cache: *const Opaque, reqs: *const CRequest, n: usize) -> i32;
    fn nvfipc_barrier(ctx: *const Opaque, ranks: *const i64, n: usize, timeout_ms: i64) -> i32;
    fn nvfipc_host_alloc(bytes: usize, out: *mut *mut c_void) -> i32;
    fn nvfipc_host_free(ptr: *mut c_void) -> i32;
    fn nvfipc_last_error_message() -> *const c_char;
}

fn check(what: &str, status: i32) {
    if status != OK {
        // SAFETY: the library returns a NUL-terminated message that lives until its next failing
        // call on this thread.
        let msg = unsafe { std::ffi::CStr::from_ptr(nvfipc_last_error_message()) };
        panic!("{what}: status {status}: {}", msg.to_string_lossy());
    }
}

const WARM_CALLS: usize = 400;
const BYTES: usize = 1 << 16;

/// Whether this machine has a CUDA device the device ranks can use.
fn cuda_device() -> bool {
    driver::device_count().is_ok_and(|n| n > 0)
}

/// Two buffers (send, receive) of the memory `kind` names, with their request kind and length:
/// the library's host memory, `cuMemAlloc`, or VMM memory of physical allocations of the device's
/// granularity created with POSIX fd handles and mapped back to back, the buffer spanning two.
/// Device memory is given back by the rank's exit.
fn buffers(kind: &str) -> ([u64; 2], i32, u64) {
    let mut out = [0u64; 2];
    match kind {
        "host" => {
            for b in &mut out {
                let mut ptr = null_mut();
                // SAFETY: `ptr` is a live out-parameter of this frame.
                check("host_alloc", unsafe { nvfipc_host_alloc(BYTES, &mut ptr) });
                *b = ptr as u64;
            }
            (out, HOST, BYTES as u64)
        }
        "device" => {
            driver::ensure_context(Some(0)).expect("a CUDA context on device 0");
            for b in &mut out {
                *b = result::mem_alloc(BYTES).expect("cuMemAlloc");
            }
            (out, DEVICE, BYTES as u64)
        }
        "vmm" => {
            let ctx = driver::ensure_context(Some(0)).expect("a CUDA context on device 0");
            let device = ctx.device().expect("the context's device");
            let segment = result::mem_granularity(device).expect("VMM granularity");
            for b in &mut out {
                let base = result::mem_address_reserve(2 * segment, segment).expect("reserve");
                for i in 0..2 {
                    let handle = result::mem_create(segment, device, result::HANDLE_TYPE_POSIX_FD)
                        .expect("cuMemCreate with a POSIX fd handle type");
                    // SAFETY: [base + i * segment, + segment) lies in the range reserved above and
                    // nothing is mapped there yet.
                    unsafe { result::mem_map(base + i * segment, segment, handle) }
                        .expect("cuMemMap");
                }
                result::mem_set_access_rw(base, 2 * segment, device).expect("cuMemSetAccess");
                *b = base;
            }
            // From the middle of the first allocation into the second.
            let half = segment / 2;
            (out.map(|b| b + half), DEVICE, segment)
        }
        other => panic!("unknown memory kind {other}"),
    }
}

/// A rank: two comms per call with its one peer (send "up", receive "down"), warmed, then
/// `WARM_CALLS` calls counted; rank 1 sleeps before every 7th call (and longer before every
/// 50th) so that rank 0 waits for it, spinning and sleeping.
#[test]
#[ignore = "a rank of warm_calls_allocate_nothing (run by it)"]
fn child() {
    let rank = env_usize("NVFIPC_T_RANK");
    let port = env_usize("NVFIPC_T_PORT") as u16;
    TRACES_LEFT.store(
        std::env::var("NVFIPC_T_TRACE_ALLOCS").map_or(0, |n| n.parse().unwrap_or(0)),
        Ordering::Relaxed,
    );
    let host = CString::new("127.0.0.1").unwrap();
    let (up, down) = (CString::new("up").unwrap(), CString::new("down").unwrap());
    let peer = 1 - rank as i64;
    // SAFETY: every pointer handed over is either a live out-parameter of this frame or a
    // NUL-terminated string of this frame; the handles are used only while alive and freed once.
    unsafe {
        let mut ctx = null_mut();
        check(
            "connect",
            nvfipc_context_connect(
                rank as i64,
                2,
                host.as_ptr(),
                port,
                rank == 0,
                20_000,
                &mut ctx,
            ),
        );
        let mut cache = null_mut();
        check("cache_create", nvfipc_cache_create(ctx, &mut cache));
        let memory = std::env::var("NVFIPC_T_WARM").expect("the memory kind");
        let ([send, recv], kind, bytes) = buffers(&memory);
        // Rank 0 sends "up" and receives "down"; rank 1 the other way round.
        let (send_tag, recv_tag) = if rank == 0 {
            (&up, &down)
        } else {
            (&down, &up)
        };
        let reqs = [
            CRequest {
                peer,
                direction: SEND,
                kind,
                tag: send_tag.as_ptr(),
                ptr: send,
                bytes,
            },
            CRequest {
                peer,
                direction: RECV,
                kind,
                tag: recv_tag.as_ptr(),
                ptr: recv,
                bytes,
            },
        ];
        for _ in 0..20 {
            check(
                "cold/warm-up exchange",
                nvfipc_exchange_handles(cache, reqs.as_ptr(), 2),
            );
        }
        check("barrier", nvfipc_barrier(ctx, std::ptr::null(), 0, 20_000));
        COUNTING.store(true, Ordering::SeqCst);
        for call in 0..WARM_CALLS {
            // Short lags keep rank 0 spinning for its peer; long ones send it to sleep.
            if rank == 1 && call % 7 == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
            if rank == 1 && call % 50 == 25 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let status = nvfipc_exchange_handles(cache, reqs.as_ptr(), 2);
            if status != OK {
                COUNTING.store(false, Ordering::SeqCst);
                check("warm exchange", status);
            }
        }
        COUNTING.store(false, Ordering::SeqCst);
        let allocations = ALLOCATIONS.load(Ordering::SeqCst);
        println!(
            "rank {rank}: {allocations} allocation(s) in {WARM_CALLS} warm calls ({memory} memory)"
        );
        check("barrier", nvfipc_barrier(ctx, std::ptr::null(), 0, 20_000));
        check("cache_free", nvfipc_cache_free(cache));
        if kind == HOST {
            check("host_free", nvfipc_host_free(send as *mut c_void));
            check("host_free", nvfipc_host_free(recv as *mut c_void));
        }
        check("context_free", nvfipc_context_free(ctx));
        assert_eq!(
            allocations, 0,
            "rank {rank}: warm calls allocated {allocations} time(s) in {WARM_CALLS} calls \
             (NVFIPC_T_TRACE_ALLOCS=5 prints where)"
        );
    }
}

/// Two ranks of `memory` buffers; every rank must report 0 allocations.
fn two_ranks_allocate_nothing(memory: &str) {
    let port = common::free_port();
    let mut ranks = Ranks::spawn("NVFIPC_T_WARM", memory, 2, port, "warm-allocs");
    let results = ranks.collect(Duration::from_secs(120));
    for (rank, (ok, out)) in results.iter().enumerate() {
        assert!(ok, "rank {rank} failed:\n{out}");
        assert!(out.contains("0 allocation(s)"), "rank {rank}:\n{out}");
    }
}

#[test]
fn warm_calls_allocate_nothing() {
    two_ranks_allocate_nothing("host");
}

/// The same with device memory, where this machine has a CUDA device (skipped, saying so, where
/// it has none).
fn two_device_ranks_allocate_nothing(memory: &str) {
    if !cuda_device() {
        eprintln!("SKIPPED: no CUDA device here (runs on a GPU machine)");
        return;
    }
    two_ranks_allocate_nothing(memory);
}

#[test]
fn warm_device_calls_allocate_nothing() {
    two_device_ranks_allocate_nothing("device");
}

#[test]
fn warm_vmm_calls_allocate_nothing() {
    two_device_ranks_allocate_nothing("vmm");
}
