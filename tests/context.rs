//! `Context` over the real store: job ids, barriers, and store lifetime when the hosting rank
//! finishes first. Multi-process cases re-run this test binary as rank processes.

use nvfuser_ipc::ffi::context::{nvfipc_context_free, nvfipc_context_from_env};
use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::Store;
use nvfuser_ipc::Status;
use nvfuser_ipc::{Context, ContextOptions, EnvOptions};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::{free_port, rerun_args};

const ROLE_VAR: &str = "NVFIPC_CONTEXT_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(20);
/// How long the non-hosting ranks keep working after the host has closed its context.
const TAIL: Duration = Duration::from_millis(500);

/// Launcher variables a rank process must not inherit from whoever runs the tests.
const CLEARED: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "NVFUSER_MASTER_ADDR",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NVFIPC_STORE_ADDR",
    "NVFIPC_TIMEOUT_MS",
    "NVFIPC_STORE_THREADS",
];

/// Starts this test binary as rank `rank` of `world`, running [`rank_process`] in `role`.
fn spawn_rank(role: &str, rank: usize, world: usize, extra: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(rerun_args("rank_process"))
        .env(ROLE_VAR, role)
        .env("WORLD_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("WORLD_LOCAL_RANK", rank.to_string())
        .env("WORLD_LOCAL_SIZE", world.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in CLEARED {
        cmd.env_remove(var);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn rank process")
}

/// Waits for a rank process, killing it past `limit`.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// One rank of a multi-process test; only does something when a test above started it.
#[test]
#[ignore = "a rank process, started by the multi-process tests of this file"]
fn rank_process() {
    let role = std::env::var(ROLE_VAR).expect("started without a role");
    if role == "c-host-alone" {
        // Through the C ABI, with the timeout from NVFIPC_TIMEOUT_MS, as a C program would.
        let mut ctx = std::ptr::null_mut();
        assert_eq!(nvfipc_context_from_env(&mut ctx), Status::Ok);
        let start = Instant::now();
        let status = nvfipc_context_free(ctx);
        println!(
            "freed after {} ms with {status:?}",
            start.elapsed().as_millis()
        );
        return;
    }
    if role == "disagree" {
        // Long enough that only being told at once passes.
        let options = EnvOptions {
            timeout: Some(Duration::from_secs(120)),
            ..EnvOptions::default()
        };
        let start = Instant::now();
        let told = |e: nvfuser_ipc::Error| {
            println!("refused after {} ms: {e}", start.elapsed().as_millis())
        };
        // A hosting rank 0 lingers at close for the others: told before that.
        match Context::from_env(&options) {
            Ok(ctx) => told(ctx.barrier(None, None).unwrap_err()),
            Err(e) => told(e),
        }
        return;
    }
    let options = EnvOptions {
        timeout: Some(TIMEOUT),
        ..EnvOptions::default()
    };
    let ctx = Context::from_env(&options).unwrap();
    let rank = ctx.rank;
    match role.as_str() {
        "host-first" => {
            assert_eq!(ctx.hosted_store_port().is_some(), rank == 0);
            ctx.barrier(None, None).unwrap();
            if rank == 0 {
                let start = Instant::now();
                ctx.close().unwrap();
                println!("host closed after {} ms", start.elapsed().as_millis());
                return;
            }
            // The host has left its code by now; the store must still be there.
            thread::sleep(TAIL);
            let others: Vec<usize> = (1..ctx.world_size).collect();
            ctx.store.set(&format!("late/{rank}"), b"x").unwrap();
            ctx.barrier(Some(&others), None).unwrap();
            for r in &others {
                ctx.store.get(&format!("late/{r}"), TIMEOUT).unwrap();
            }
            ctx.close().unwrap();
            println!("rank {rank} finished");
        }
        "exit-without-close" => {
            ctx.barrier(None, None).unwrap();
            // Leaves without closing the context: only the closed socket tells the host.
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn hosting_rank_finishing_first_does_not_break_the_others() {
    const WORLD: usize = 4;
    let port = free_port();
    // The hosted store runs three event loops here (the default is one).
    let extra = [
        ("NVFUSER_MASTER_PORT", port.to_string()),
        ("NVFIPC_STORE_THREADS", "3".to_string()),
    ];
    let children: Vec<Child> = (0..WORLD)
        .map(|r| spawn_rank("host-first", r, WORLD, &extra))
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();
    for (r, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "rank {r}: {}", text(out));
    }
    for (r, out) in outputs.iter().enumerate().skip(1) {
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("rank {r} finished")),
            "{}",
            text(out)
        );
    }
    // The host's close waited for the others' tail of work.
    let host = String::from_utf8_lossy(&outputs[0].stdout).into_owned();
    let waited: u64 = host
        .split("host closed after ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{}", text(&outputs[0])));
    assert!(waited as u128 >= TAIL.as_millis() / 2, "waited {waited} ms");
}

#[test]
fn host_returns_once_a_rank_left_without_closing() {
    let mut host = Context::connect(0, 2, "127.0.0.1", 0, true, TIMEOUT).unwrap();
    let port = host.hosted_store_port().unwrap();
    let child = spawn_rank(
        "exit-without-close",
        1,
        2,
        &[("NVFIPC_STORE_ADDR", format!("127.0.0.1:{port}"))],
    );
    host.barrier(None, None).unwrap();
    let out = finish(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    host.set_host_linger(Duration::from_secs(30));
    let start = Instant::now();
    host.close().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

/// The hosting rank of a world of two whose other rank died before joining: freeing its context
/// waits for the missing rank no longer than NVFIPC_TIMEOUT_MS.
#[test]
fn host_free_is_bounded_by_the_configured_timeout() {
    let port = free_port();
    let child = spawn_rank(
        "c-host-alone",
        0,
        2,
        &[
            ("NVFUSER_MASTER_PORT", port.to_string()),
            ("NVFIPC_TIMEOUT_MS", "1500".to_string()),
        ],
    );
    let out = finish(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    let ms: u64 = said
        .split("freed after ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        ms < 5 * 1500,
        "freeing took {ms} ms with NVFIPC_TIMEOUT_MS=1500: {said}"
    );
}

#[test]
fn host_close_is_bounded_by_the_linger() {
    let mut host = Context::connect(0, 2, "127.0.0.1", 0, true, TIMEOUT).unwrap();
    let port = host.hosted_store_port().unwrap();
    let peer = thread::spawn(move || {
        let ctx = Context::connect(1, 2, "127.0.0.1", port, false, TIMEOUT).unwrap();
        ctx.barrier(None, None).unwrap();
        ctx
    });
    host.barrier(None, None).unwrap();
    let peer = peer.join().unwrap();
    assert_eq!(peer.job_id, host.job_id);

    host.set_host_linger(Duration::from_millis(300));
    let start = Instant::now();
    let err = host.close().unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.status, Status::Timeout, "{err}");
    assert!(err.message.contains("300 ms"), "{err}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(10));
    // The store is gone now: the peer gets an error, not a hang.
    assert!(peer.store.get("anything", Duration::from_secs(2)).is_err());
}

#[test]
fn peers_closing_first_let_the_host_close_at_once() {
    let host = Context::connect(0, 3, "localhost", 0, true, TIMEOUT).unwrap();
    let port = host.hosted_store_port().unwrap();
    let peers: Vec<_> = (1..3)
        .map(|rank| {
            thread::spawn(move || {
                let ctx = Context::connect(rank, 3, "localhost", port, false, TIMEOUT).unwrap();
                ctx.barrier(None, None).unwrap();
                ctx.close().unwrap();
            })
        })
        .collect();
    host.barrier(None, None).unwrap();
    for p in peers {
        p.join().unwrap();
    }
    let start = Instant::now();
    host.close().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn explicit_store_and_job_ids_per_run() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let connect = || -> Arc<dyn Store> {
        Arc::new(
            TcpStore::connect(
                "127.0.0.1",
                server.port(),
                &ConnectOptions::with_timeout(TIMEOUT),
            )
            .unwrap(),
        )
    };
    let options = || ContextOptions {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        store: connect(),
    };
    let first = Context::new(options()).unwrap();
    assert_eq!(first.job_id.len(), 16);
    assert!(first.job_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        first.timeout(),
        TIMEOUT,
        "the store's timeout is the default"
    );
    assert_eq!(first.barrier(None, None).unwrap(), 0);
    assert_eq!(first.hosted_store_port(), None);
    let first_id = first.job_id.clone();
    first.close().unwrap();
    // A long-lived store serves the next run under a new id.
    let second = Context::new(options()).unwrap();
    assert_ne!(second.job_id, first_id);
}

#[test]
fn a_malformed_store_threads_variable_is_reported() {
    let extra = [
        ("NVFUSER_MASTER_PORT", free_port().to_string()),
        ("NVFIPC_STORE_THREADS", "lots".to_string()),
    ];
    let out = finish(
        spawn_rank("host-first", 0, 1, &extra),
        Duration::from_secs(30),
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("NVFIPC_STORE_THREADS")
            && text(&out).contains("lots")
            && text(&out).contains("is not a thread count"),
        "{}",
        text(&out)
    );
}

#[test]
fn connect_reports_an_unreachable_store() {
    let port = free_port();
    let start = Instant::now();
    let err =
        Context::connect(1, 2, "127.0.0.1", port, false, Duration::from_millis(300)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(err.message.contains("rank 1 of 2"), "{err}");
    assert!(err.message.contains(&port.to_string()), "{err}");
}

#[test]
fn ranks_started_with_different_world_sizes_are_told_at_once() {
    let port = free_port();
    let master = [
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
    ];
    let zero = spawn_rank("disagree", 0, 2, &master);
    let one = spawn_rank("disagree", 1, 3, &master);
    let (zero, one) = (
        text(&finish(zero, TIMEOUT * 3)),
        text(&finish(one, TIMEOUT * 3)),
    );
    for (out, says) in [
        (&zero, "rank 0 of 2: rank 1 (pid "),
        (
            &zero,
            "says world size 3 (from WORLD_SIZE) where this rank says 2 (from WORLD_SIZE)",
        ),
        (&one, "rank 1 of 3: waiting for rank 0 to open a run"),
        (&one, ": rank 0 (pid "),
        (
            &one,
            "says world size 2 (from WORLD_SIZE) where this rank says 3 (from WORLD_SIZE)",
        ),
    ] {
        assert!(out.contains(says), "{says:?} not in\n{out}");
    }
    for out in [&zero, &one] {
        let ms: u64 = out
            .split("refused after ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(ms < 20_000, "told after {ms} ms, not at once:\n{out}");
    }
}
