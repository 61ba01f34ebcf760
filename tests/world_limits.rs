//! Absurd world sizes and member lists are refused against the documented limit
//! (`MAX_WORLD_SIZE`, `NVFIPC_MAX_WORLD_SIZE` in C) by every constructor and member list, through
//! the Rust API and the C ABI; and a barrier over the largest world allowed returns within its
//! timeout.

use nvfuser_ipc::ffi::barrier::nvfipc_barrier;
use nvfuser_ipc::ffi::boundary::nvfipc_last_error_message;
use nvfuser_ipc::ffi::context::{
    nvfipc_context_connect, nvfipc_context_free, NVFIPC_MAX_WORLD_SIZE,
};
use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::tools::barrier::{barrier, BarrierState, MemberSet};
use nvfuser_ipc::tools::config::{RankInfo, MAX_WORLD_SIZE};
use nvfuser_ipc::Status;
use nvfuser_ipc::{Context, ContextOptions};
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HUGE: [usize; 4] = [MAX_WORLD_SIZE + 1, 100_000_000, 1 << 40, 1 << 62];

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until its next call here.
    unsafe { CStr::from_ptr(nvfipc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn store(port: u16, timeout: Duration) -> TcpStore {
    let opts = ConnectOptions {
        timeout,
        connect_timeout: Duration::from_secs(10),
        wait_for_workers: None,
    };
    TcpStore::connect("127.0.0.1", port, &opts).unwrap()
}

#[test]
fn rust_constructors_and_member_lists_refuse_worlds_above_the_limit() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let s = Arc::new(store(server.port(), Duration::from_secs(5)));
    for world in HUGE {
        let e = RankInfo::new(0, world, 0, 1).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains(&MAX_WORLD_SIZE.to_string()), "{e}");

        let start = Instant::now();
        let e = Context::connect(0, world, "127.0.0.1", server.port(), false, Duration::ZERO)
            .unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        let e = Context::new(ContextOptions {
            rank: 0,
            world_size: world,
            local_rank: 0,
            local_world_size: 1,
            store: s.clone(),
        })
        .unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");

        let e = MemberSet::new(0, world, None).unwrap_err();
        assert!(e.message.contains("above the limit"), "{e}");
        let e = MemberSet::new(0, world, Some(&[0, world - 1])).unwrap_err();
        assert!(e.message.contains("above the limit"), "{e}");
        let state = BarrierState::new();
        let e = barrier(&*s, &state, 0, world, None, Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
    // A member list longer than the world cannot be a set of its ranks.
    let e = MemberSet::new(0, 2, Some(&[0, 1, 1])).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    // The largest world itself is accepted.
    RankInfo::new(MAX_WORLD_SIZE - 1, MAX_WORLD_SIZE, 0, 1).unwrap();
    MemberSet::new(0, MAX_WORLD_SIZE, Some(&[0, MAX_WORLD_SIZE - 1])).unwrap();
}

#[test]
fn c_abi_refuses_worlds_above_the_limit() {
    assert_eq!(NVFIPC_MAX_WORLD_SIZE as usize, MAX_WORLD_SIZE);
    let host = CString::new("127.0.0.1").unwrap();
    for world in HUGE.iter().map(|&w| w as i64).chain([i64::MAX]) {
        let mut ctx = std::ptr::null_mut();
        let start = Instant::now();
        let status = nvfipc_context_connect(0, world, host.as_ptr(), 0, true, 200, &mut ctx);
        assert_eq!(status, Status::InvalidArgument, "world {world}");
        assert!(ctx.is_null());
        let msg = last_error();
        assert!(
            msg.contains("NVFIPC_MAX_WORLD_SIZE") && msg.contains(&world.to_string()),
            "{msg}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    // A real context of one: a member count above its world size is refused before the list is
    // read.
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        nvfipc_context_connect(0, 1, host.as_ptr(), 0, true, 2000, &mut ctx),
        Status::Ok,
        "{}",
        last_error()
    );
    let one = [0i64];
    for n in [MAX_WORLD_SIZE + 1, usize::MAX] {
        assert_eq!(
            nvfipc_barrier(ctx, one.as_ptr(), n, 0),
            Status::InvalidArgument
        );
        assert!(
            last_error().contains(&format!(
                "`n_ranks` = {n} is above the limit of the world size = 1"
            )),
            "{}",
            last_error()
        );
    }
    // Within the limit, the list itself is checked (here: a rank outside the world).
    let outside = [3i64];
    assert_eq!(
        nvfipc_barrier(ctx, outside.as_ptr(), 1, 0),
        Status::InvalidArgument
    );
    assert!(last_error().contains("`ranks[0]` = 3"), "{}", last_error());
    assert_eq!(nvfipc_barrier(ctx, one.as_ptr(), 1, 0), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
}

/// Barriers over the largest world allowed, as the coordinator and as another member, with a
/// 400 ms timeout: both return a timeout error in time (naming missing ranks), whatever the
/// number of members to wait for or to diagnose.
#[test]
fn barrier_over_the_largest_world_returns_within_its_timeout() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let timeout = Duration::from_millis(400);
    for rank in [0, 1, MAX_WORLD_SIZE - 1] {
        let s = store(server.port(), timeout);
        let state = BarrierState::scoped(&format!("largest-{rank}"));
        let start = Instant::now();
        let e = barrier(&s, &state, rank, MAX_WORLD_SIZE, None, timeout).unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.status, Status::Timeout, "{e}");
        assert!(
            e.message.contains("did not arrive") || e.message.contains("not checked"),
            "{e}"
        );
        assert!(
            took < 5 * timeout,
            "rank {rank}: the barrier took {took:?}: {e}"
        );
    }
    // The C ABI, hosting the store: barrier and free both come back in time.
    let host = CString::new("127.0.0.1").unwrap();
    let mut ctx = std::ptr::null_mut();
    let start = Instant::now();
    assert_eq!(
        nvfipc_context_connect(
            0,
            MAX_WORLD_SIZE as i64,
            host.as_ptr(),
            0,
            true,
            400,
            &mut ctx
        ),
        Status::Ok,
        "{}",
        last_error()
    );
    let status = nvfipc_barrier(ctx, std::ptr::null(), 0, 400);
    assert_eq!(status, Status::Timeout, "{}", last_error());
    assert!(
        last_error().contains("timed out after 400 ms"),
        "{}",
        last_error()
    );
    let _ = nvfipc_context_free(ctx);
    let took = start.elapsed();
    assert!(
        took < 10 * timeout,
        "connect + barrier + free took {took:?}"
    );
}
