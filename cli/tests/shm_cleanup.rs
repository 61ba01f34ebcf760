//! Nothing of a finished, terminated or killed process stays in /dev/shm. Each test re-runs this
//! test binary as a rank process (the ignored `holder` test) that creates a cache (its board in
//! /dev/shm, its semaphore slab) and host buffers it never frees, then ends in the way under
//! test. Host buffers and slabs are anonymous files, so only the board has a name to leave.
//!
//! Every new cache on this machine removes the boards of dead processes, whatever their job: the
//! test that watches a killed process's board be removed runs in a mount namespace of its own
//! with its own tmpfs on /dev/shm, where no other job can remove it first.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::CacheConfig;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const ROLE: &str = "NVFIPC_CLEANUP_ROLE";
/// Set in a test re-run by [`private_shm`] inside its own mount namespace.
const PRIVATE_SHM: &str = "NVFIPC_T_PRIVATE_SHM";

fn job(test: &str) -> String {
    format!("c{test}{}", std::process::id() % 100_000)
}

fn entries(job: &str) -> Vec<String> {
    let prefix = nvfuser_ipc::tools::host::job_prefix(job);
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Where a test sees /dev/shm.
#[derive(PartialEq, Eq)]
enum Shm {
    /// A tmpfs of this test's own: only its processes name anything in it.
    Private,
    /// The machine's, which the caches of every other job on it sweep too.
    Shared,
}

/// Runs the test `name` of this binary again in a mount namespace of its own with a tmpfs on
/// /dev/shm (`unshare -m`, as the multinode tests do), and fails when that run fails. Returns
/// `None` once it ran there, `Some(Shm::Private)` inside that run, and `Some(Shm::Shared)` where
/// this machine forbids mount namespaces (the test then runs beside whatever else runs here).
fn private_shm(name: &str) -> Option<Shm> {
    if std::env::var_os(PRIVATE_SHM).is_some() {
        return Some(Shm::Private);
    }
    let mount = "mount -t tmpfs -o size=16m nvfipc-test /dev/shm";
    let permitted = Command::new("unshare")
        .args(["-m", "sh", "-c", mount])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !permitted {
        println!(
            "note: no mount namespace here (unshare -m failed): {name} shares /dev/shm with \
             every other job on this machine"
        );
        return Some(Shm::Shared);
    }
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &format!("{mount} && exec \"$0\" \"$@\"")])
        .arg(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture"])
        .env(PRIVATE_SHM, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} in its own /dev/shm: {:?}\n{text}",
        out.status
    );
    None
}

/// Starts a holder for `job` and waits until it has created everything.
fn start(role: &str, job: &str, port: u16) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["holder", "--exact", "--ignored", "--nocapture"])
        .env(ROLE, role)
        .env("NVFIPC_T_JOB", job)
        .env("NVFIPC_T_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("holding") {
        line.clear();
    }
    assert!(line.contains("holding"), "the holder did not start");
    child
}

/// A rank of a job started by `nvfipc launch`: rank 1 fails once both hold shared memory, so the
/// launcher terminates rank 0 (SIGTERM).
fn launched_rank() {
    use nvfuser_ipc::{Context, EnvOptions};
    let ctx = Context::from_env(&EnvOptions::default()).unwrap();
    let cache = nvfuser_ipc::cache_from_context(&ctx).unwrap();
    let _buffer = nvfuser_ipc::host_alloc(1 << 16).unwrap().into_raw();
    println!("job={}", ctx.job_id);
    ctx.barrier(None, None).unwrap();
    if ctx.rank == 1 {
        std::process::exit(3);
    }
    std::thread::sleep(Duration::from_secs(60));
    drop(cache);
}

#[test]
#[ignore = "a rank process, started by the tests of this file"]
fn holder() {
    let role = std::env::var(ROLE).unwrap();
    if role == "launched" {
        return launched_rank();
    }
    let job = std::env::var("NVFIPC_T_JOB").unwrap();
    let port: u16 = std::env::var("NVFIPC_T_PORT").unwrap().parse().unwrap();
    let store = TcpStore::connect("127.0.0.1", port, &ConnectOptions::default()).unwrap();
    let cache = nvfuser_ipc::default_cache(CacheConfig {
        rank: 0,
        world_size: 2,
        store: Arc::new(store),
        job_id: job.clone(),
        scope: String::new(),
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    let buffers: Vec<u64> = (0..3)
        .map(|_| {
            nvfuser_ipc::host_alloc_for_job(&job, 1 << 16)
                .unwrap()
                .into_raw()
        })
        .collect();
    // The board is the one name; buffers and the slab have none.
    let names = entries(&job);
    assert_eq!(names, vec![format!("nvfipc-{job}-g1-b0")], "{names:?}");
    println!("holding {} buffers and {} name", buffers.len(), names.len());
    match role.as_str() {
        // Never frees anything and leaves through exit(), as a program that forgets to.
        "exit" => {
            std::mem::forget(cache);
            std::process::exit(0)
        }
        // Waits to be terminated or killed.
        _ => {
            std::thread::sleep(Duration::from_secs(60));
            drop((cache, buffers));
        }
    }
}

#[test]
fn a_normal_exit_without_freeing_leaves_nothing() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let job = job("exit");
    let mut child = start("exit", &job, server.port());
    assert!(child.wait().unwrap().success());
    assert_eq!(entries(&job), Vec::<String>::new());
}

#[test]
fn a_terminated_process_leaves_nothing() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let job = job("term");
    let mut child = start("hold", &job, server.port());
    // SAFETY: signalling our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    // It still dies of the signal, as it would without the library.
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert_eq!(entries(&job), Vec::<String>::new());
}

#[test]
fn a_killed_process_is_cleaned_up_by_the_next_job() {
    let Some(shm) = private_shm("a_killed_process_is_cleaned_up_by_the_next_job") else {
        return;
    };
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let dead_job = job("kill");
    let mut child = start("hold", &dead_job, server.port());
    child.kill().unwrap();
    child.wait().unwrap();
    // SIGKILL runs nothing: its board is still there (its buffers went with the process) ...
    let left = entries(&dead_job);
    match shm {
        Shm::Private => assert_eq!(left.len(), 1, "{left:?}"),
        // ... unless a cache of another job on this machine was made since and removed it.
        Shm::Shared => assert!(left.len() <= 1, "{left:?}"),
    }
    // ... until the next job on this node creates its cache.
    let next_job = job("next");
    let mut next = start("exit", &next_job, server.port());
    assert!(next.wait().unwrap().success());
    assert_eq!(entries(&dead_job), Vec::<String>::new());
    assert_eq!(entries(&next_job), Vec::<String>::new());
}

#[test]
fn ranks_the_launcher_terminates_after_a_failure_leave_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_nvfipc"))
        .args(["launch", "-n", "2", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["holder", "--exact", "--ignored", "--nocapture"])
        .env(ROLE, "launched")
        .env_remove("NVFIPC_STORE_ADDR")
        .env_remove("NVFIPC_JOB_TAG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "rank 1 fails, so the job does: {text}"
    );
    let job = text
        .split("job=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(entries(job), Vec::<String>::new(), "{text}");
}
