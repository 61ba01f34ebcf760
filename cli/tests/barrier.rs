//! Barriers across real processes (`nvfipc launch` + the hidden `nvfipc barrier-test`) and over
//! the real TCP store in one process.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::tools::barrier::{barrier, BarrierState};
use nvfuser_ipc::Status;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const NVFIPC: &str = env!("CARGO_BIN_EXE_nvfipc");

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `nvfipc launch -n ranks -- nvfipc barrier-test ARGS`, killing it past `limit`.
fn launch_barrier_test(ranks: usize, args: &[&str], limit: Duration) -> Finished {
    launch_barrier_test_with(ranks, args, &[], limit)
}

/// [`launch_barrier_test`] with more environment variables.
fn launch_barrier_test_with(
    ranks: usize,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Finished {
    let start = Instant::now();
    let mut child = Command::new(NVFIPC)
        .args([
            "launch",
            "-n",
            &ranks.to_string(),
            "--",
            NVFIPC,
            "barrier-test",
        ])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvfipc launch");
    let read_all = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read_all(Box::new(child.stdout.take().unwrap()));
    let err = read_all(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            // SAFETY: kill(2) takes no pointers; the child is unreaped, so the pid is ours.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
            panic!("the launched job did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Finished {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed: start.elapsed(),
    }
}

#[test]
fn sixty_four_processes_random_subsets_hundred_rounds() {
    let run = launch_barrier_test(
        64,
        &[
            "--rounds",
            "100",
            "--subset-seed",
            "20260101",
            "--timeout-ms",
            "30000",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(run.status.code(), Some(0), "stderr:\n{}", run.stderr);
    let summaries: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("barrier-test:"))
        .collect();
    assert_eq!(summaries.len(), 1, "{}", run.stdout);
    assert!(
        summaries[0].starts_with(
            "[rank 0] barrier-test: 64 ranks, 100 rounds (random subsets, seed 20260101)"
        ),
        "{}",
        summaries[0]
    );
    eprintln!("64 ranks x 100 random-subset rounds: {:?}", run.elapsed);
}

#[test]
fn world_barriers_across_processes() {
    let run = launch_barrier_test(8, &["--rounds", "50"], Duration::from_secs(60));
    assert_eq!(run.status.code(), Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stdout
            .contains("[rank 0] barrier-test: 8 ranks, 50 rounds, rank 0 joined 50"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_missing_rank_is_named_in_the_timeout_error() {
    let run = launch_barrier_test(
        4,
        &[
            "--rounds",
            "3",
            "--timeout-ms",
            "1000",
            "--absent-rank",
            "3",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(run.status.code(), Some(1), "stderr:\n{}", run.stderr);
    let reports: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("timed out"))
        .collect();
    assert!(!reports.is_empty(), "{}", run.stderr);
    for line in reports {
        assert!(
            line.contains("barrier gen 0 over ranks [0,1,2,3] timed out after 1000 ms on rank")
                && line.contains("ranks 3 did not arrive"),
            "{line}"
        );
    }
    assert!(run.elapsed < Duration::from_secs(20), "{:?}", run.elapsed);
}

/// A barrier call's own timeout governs every store operation of the call, on every rank: with a
/// store timeout of 2 s (`NVFIPC_TIMEOUT_MS`), barriers given 20 s and one rank 4 s late to each
/// succeed, the coordinator's (which also deletes the previous generation's keys) included.
#[test]
fn an_explicit_barrier_timeout_outlasts_the_store_timeout_on_every_rank() {
    let run = launch_barrier_test_with(
        3,
        &[
            "--rounds",
            "2",
            "--barrier-timeout-ms",
            "20000",
            "--late-rank",
            "2",
            "--late-ms",
            "4000",
        ],
        &[("NVFIPC_TIMEOUT_MS", "2000")],
        Duration::from_secs(90),
    );
    assert_eq!(run.status.code(), Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stdout
            .contains("[rank 0] barrier-test: 3 ranks, 2 rounds, rank 0 joined 2"),
        "{}",
        run.stdout
    );
}

/// Four threads, each with its own connection and barrier state (as separate processes would
/// have), against the embedded server: world and pair barriers alternate, and the number of
/// keys in the store does not grow with the number of barriers.
#[test]
fn tcp_store_barriers_collect_old_keys() {
    const WORLD: usize = 4;
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port();
    let connect = move || {
        TcpStore::connect(
            "127.0.0.1",
            port,
            &ConnectOptions::with_timeout(Duration::from_secs(20)),
        )
        .unwrap()
    };
    let mut states: Vec<BarrierState> = (0..WORLD).map(|_| BarrierState::new()).collect();
    let mut run_rounds = |rounds: usize| {
        let handles: Vec<_> = states
            .drain(..)
            .enumerate()
            .map(|(rank, state)| {
                let store = connect();
                thread::spawn(move || {
                    let pair = [rank & !1, rank | 1];
                    for round in 0..rounds {
                        let members = (round % 2 == 1).then_some(&pair[..]);
                        barrier(
                            &store,
                            &state,
                            rank,
                            WORLD,
                            members,
                            Duration::from_secs(20),
                        )
                        .unwrap();
                    }
                    state
                })
            })
            .collect();
        states.extend(handles.into_iter().map(|h| h.join().unwrap()));
    };
    let probe = connect();
    run_rounds(10);
    let after_ten = probe.num_keys().unwrap();
    run_rounds(200);
    let after_many = probe.num_keys().unwrap();
    assert!(after_ten > 0);
    assert_eq!(
        after_many, after_ten,
        "the store grew with the number of barriers"
    );
    drop(probe);
    server.shutdown();
}

#[test]
fn tcp_store_barrier_timeout_names_missing_ranks() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let store = TcpStore::connect(
        "127.0.0.1",
        server.port(),
        &ConnectOptions::with_timeout(Duration::from_secs(10)),
    )
    .unwrap();
    let state = BarrierState::new();
    let start = Instant::now();
    let err = barrier(
        &store,
        &state,
        2,
        6,
        Some(&[1, 2, 5]),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(err.status, Status::Timeout);
    assert!(
        err.message
            .starts_with("barrier gen 0 over ranks [1,2,5] timed out after 300 ms on rank 2: ranks 1,5 did not arrive"),
        "{}",
        err.message
    );
}
