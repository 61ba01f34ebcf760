//! The log across real processes: with `NVFIPC_DEBUG=INFO` and `NVFIPC_DEBUG_FILE`, an exchange
//! whose peer never calls explains itself in the log while it waits and when it gives up.

use nvfuser_ipc::default_transports;
use nvfuser_ipc::error::Status;
use nvfuser_ipc::exchange::{CacheConfig, MemKind, Request};
use nvfuser_ipc::host;
use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::Store;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const ROLE: &str = "NVFIPC_LOG_CHILD";
const T: Duration = Duration::from_secs(20);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"))
}

/// A rank of the scenario: rank 0 exchanges with rank 1, which creates its cache and never
/// calls; rank 0 gives up after 2.5 s.
#[test]
#[ignore = "run by the tests below as a child process"]
fn child() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let rank: usize = env("NVFIPC_T_RANK").parse().unwrap();
    let port: u16 = env("NVFIPC_T_PORT").parse().unwrap();
    let job = env("NVFIPC_T_JOB");
    let store = Arc::new(
        TcpStore::connect("127.0.0.1", port, &ConnectOptions::with_timeout(T)).expect("store"),
    );
    host::alloc::set_default_job(&job);
    let cache = default_transports::cache(CacheConfig {
        rank,
        world_size: 2,
        store: store.clone(),
        job_id: job.clone(),
        scope: String::new(),
        timeout: T,
    })
    .expect("cache");
    let done = format!("{job}/done");
    if rank == 0 {
        let buf = host::alloc(64).expect("host alloc");
        let req = Request::send(1, "stuck", buf.addr(), 64, MemKind::Host);
        let err = cache
            .exchange_handles_timeout(&[req], Duration::from_millis(2500))
            .unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
        store.set(&done, b"1").unwrap();
    } else {
        store.get(&done, T).expect("rank 0 finishes");
    }
    cache.close();
}

#[test]
fn a_stuck_exchange_explains_itself_in_the_log() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let dir = std::env::temp_dir().join(format!("nvfipc-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let job = format!("log{}", std::process::id());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "child", "--nocapture"])
                .env(ROLE, "1")
                .env("NVFIPC_T_RANK", rank.to_string())
                .env("NVFIPC_T_PORT", server.port().to_string())
                .env("NVFIPC_T_JOB", &job)
                .env("NVFIPC_DEBUG", "info")
                .env("NVFIPC_DEBUG_SUBSYS", "exchange,store")
                .env("NVFIPC_DEBUG_FILE", dir.join(format!("r{rank}-%h-%p.log")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let mut pids = Vec::new();
    for (rank, c) in children.into_iter().enumerate() {
        pids.push(c.id());
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {rank} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let host = nvfuser_ipc::node::host_name();
    let read = |rank: usize| {
        let path = dir.join(format!("r{rank}-{host}-{}.log", pids[rank]));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("rank {rank}'s log {path:?} (%h and %p expanded): {e}"))
    };
    let log0 = read(0);
    let log1 = read(1);
    let _ = std::fs::remove_dir_all(&dir);
    println!("rank 0's log:\n{log0}\nrank 1's log:\n{log1}");
    let has =
        |log: &str, needles: &[&str]| log.lines().any(|l| needles.iter().all(|n| l.contains(n)));
    assert!(
        has(
            &log0,
            &["[rank 0] NVFIPC INFO exchange: rank 0: cache created"]
        ),
        "{log0}"
    );
    // While it waits: who, for whom, on which channel, at which step.
    assert!(
        has(
            &log0,
            &[
                "rank 0: still waiting after 1.",
                "for peer rank 1 on channel 0 -> 1 tag \"stuck\"",
                "to reach step 1",
            ]
        ),
        "{log0}"
    );
    // What it published, under which key.
    assert!(has(&log0, &["sent 1 record(s)", "/stuck#0\""]), "{log0}");
    // When it gives up: suspended, with the timeout's own message.
    assert!(
        has(
            &log0,
            &["suspended after", "timed out", "peer rank 1", "step 1"]
        ),
        "{log0}"
    );
    // The silent rank's log shows its cache and no exchange.
    assert!(has(&log1, &["[rank 1]", "rank 1: cache created"]), "{log1}");
    assert!(!has(&log1, &["exchange of"]), "{log1}");
}
