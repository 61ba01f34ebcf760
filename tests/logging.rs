//! The log across real processes: with `NVFIPC_DEBUG=INFO` and `NVFIPC_DEBUG_FILE`, an exchange
//! whose peer never calls explains itself in the log while it waits and when it gives up.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::Status;
use nvfuser_ipc::{CacheConfig, MemKind, Request};
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
    nvfuser_ipc::tools::host::set_default_job(&job);
    let cache = nvfuser_ipc::default_cache(CacheConfig {
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
        let buf = nvfuser_ipc::host_alloc(64).expect("host alloc");
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
    let host = nvfuser_ipc::tools::node::host_name();
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
            &["[rank 0] NVFIPC INFO exchange: rank 0: cache generation 1 of job"]
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
    assert!(
        has(&log1, &["[rank 1]", "rank 1: cache generation 1 of job"]),
        "{log1}"
    );
    assert!(!has(&log1, &["exchange of"]), "{log1}");
}

/// A process whose first library call opens `NVFIPC_DEBUG_FILE`: logs one WARN line through the
/// library's logger and says so on stdout.
#[test]
#[ignore = "run by the tests below as a child process"]
fn file_child() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    nvfuser_ipc::tools::logging::init();
    log::warn!(target: nvfuser_ipc::tools::logging::STORE, "marker line of the child");
    println!("child finished");
}

/// Runs `file_child` with `NVFIPC_DEBUG_FILE=file`; kills it and fails when it has not finished
/// within 20 s (a blocked open). Returns its stdout and stderr.
fn run_with_log_file(file: &std::path::Path) -> (String, String) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "file_child", "--nocapture"])
        .env(ROLE, "1")
        .env("NVFIPC_DEBUG", "warn")
        .env("NVFIPC_DEBUG_FILE", file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > T {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child hung with NVFIPC_DEBUG_FILE={file:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && stdout.contains("child finished"),
        "child failed ({:?}):\n{stdout}{stderr}",
        out.status
    );
    (stdout, stderr)
}

fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nvfipc-logfile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The warning of a refused file and the child's line, both on stderr.
fn assert_refused_to_stderr(stderr: &str, why: &str) {
    assert!(
        stderr.contains("NVFIPC_DEBUG_FILE=")
            && stderr.contains("is not used")
            && stderr.contains(why),
        "no warning naming {why:?}:\n{stderr}"
    );
    assert!(stderr.contains("marker line of the child"), "{stderr}");
}

#[test]
fn a_fifo_as_log_file_with_no_reader_does_not_hang_the_process() {
    let dir = scratch_dir("fifo");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let (_, stderr) = run_with_log_file(&fifo);
    assert_refused_to_stderr(&stderr, "FIFO");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_symbolic_link_as_log_file_is_refused_and_its_target_not_created() {
    let dir = scratch_dir("link");
    let target = dir.join("target");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (_, stderr) = run_with_log_file(&link);
    assert_refused_to_stderr(&stderr, "symbolic link");
    assert!(!target.exists(), "the link's target was created");
    // An existing target is not written through the link either.
    std::fs::write(&target, "kept\n").unwrap();
    let (_, stderr) = run_with_log_file(&link);
    assert_refused_to_stderr(&stderr, "symbolic link");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_as_log_file_is_refused() {
    let dir = scratch_dir("dir");
    let (_, stderr) = run_with_log_file(&dir);
    assert_refused_to_stderr(&stderr, "directory");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_existing_regular_log_file_is_appended_to() {
    let dir = scratch_dir("file");
    let file = dir.join("log");
    std::fs::write(&file, "earlier line\n").unwrap();
    let (_, stderr) = run_with_log_file(&file);
    assert!(!stderr.contains("marker line"), "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("earlier line\n"), "{text}");
    assert!(
        text.contains("NVFIPC WARN store: marker line of the child"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
