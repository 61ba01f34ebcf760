//! The fd transport across real processes: a memfd passed from one process to another and read
//! through mmap, many ids and concurrent importers, malformed frames, a peer in another network
//! namespace (path fallback), a denied `pidfd_getfd` rung with its diagnosis, bounded timeouts,
//! socket files cleaned up, and processes outside the trust boundary (another uid; this uid but
//! not of the job) that find the responder and get nothing.
//!
//! Each cross-process test starts a store server in the test process and re-executes this test
//! binary once per rank, running the ignored `child` test with the scenario in the environment;
//! every rank gets a socket directory of the test's own, checked empty once the ranks exit.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::Store;
use nvfuser_ipc::tools::fdpass::frame::{ErrorCode, FetchRequest, Parsed, Reply, Secret};
use nvfuser_ipc::tools::fdpass::{
    self, record_key, FdId, FdPass, FdPassConfig, Gate, LocalIdentity, PeerRecord, PtracerState,
    Rung,
};
use nvfuser_ipc::tools::os::memfd;
use nvfuser_ipc::Status;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{rerun_args, Ranks};

const ROLE: &str = "NVFIPC_FDPASS_CHILD";
const T: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------------

fn job_id(scenario: &str) -> String {
    format!("fd{scenario}{}", std::process::id() % 100_000)
}

/// A socket directory of the test's own, `0700` (so the sockets go straight into it).
fn socket_dir(job: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("nvfipc-fdtest-{job}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn sockets_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One rank process; `wrapper` runs before the binary (e.g. `setpriv ...`).
fn spawn(
    scenario: &str,
    rank: usize,
    world: usize,
    port: u16,
    job: &str,
    dir: &Path,
    wrapper: &[&str],
) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(rerun_args("child"))
        .env(ROLE, scenario)
        .env("NVFIPC_T_RANK", rank.to_string())
        .env("NVFIPC_T_WORLD", world.to_string())
        .env("NVFIPC_T_PORT", port.to_string())
        .env("NVFIPC_T_JOB", job)
        .env("NVFIPC_SOCKET_DIR", dir)
        .env_remove("NVFIPC_FD_RUNGS")
        .env_remove("NVFIPC_FD_PTRACER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("spawn rank")
}

/// Runs `scenario` over `world` ranks (rank r wrapped in `wrappers(r)`), asserts that every
/// rank succeeded and that the socket directory is empty afterwards; returns the outputs.
fn run(scenario: &str, world: usize, wrappers: impl Fn(usize) -> Vec<&'static str>) -> Vec<String> {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id(scenario);
    let dir = socket_dir(&job);
    let children = (0..world)
        .map(|r| spawn(scenario, r, world, server.port(), &job, &dir, &wrappers(r)))
        .collect();
    let results = Ranks { children }.collect(Duration::from_secs(60));
    for (rank, (_, out)) in results.iter().enumerate() {
        println!("--- {scenario} rank {rank}:\n{out}");
    }
    for (rank, (ok, out)) in results.iter().enumerate() {
        assert!(ok, "{scenario}: rank {rank} failed:\n{out}");
    }
    let left = sockets_in(&dir);
    assert!(left.is_empty(), "{scenario}: socket files left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
    results.into_iter().map(|(_, out)| out).collect()
}

#[test]
fn memfd_passes_between_processes_and_is_shared() {
    let outs = run("memfd", 2, |_| vec![]);
    assert!(
        outs[0].contains("exporter saw the importer's write"),
        "{}",
        outs[0]
    );
    assert!(outs[1].contains("via abstract"), "{}", outs[1]);
    assert!(outs[1].contains("pidfd rung delivered"), "{}", outs[1]);
}

#[test]
fn many_ids_and_concurrent_importers() {
    let outs = run("many", 4, |_| vec![]);
    assert!(outs[0].contains("served 768 fds"), "{}", outs[0]);
}

#[test]
fn malformed_frames_get_errors_and_the_responder_keeps_serving() {
    let outs = run("malformed", 2, |_| vec![]);
    assert!(outs[0].contains("malformed=3"), "{}", outs[0]);
    assert!(outs[1].contains("fetched after abuse"), "{}", outs[1]);
}

#[test]
fn a_peer_in_another_network_namespace_uses_the_socket_path() {
    let outs = run("netns", 2, |_| vec![]);
    if outs[1].contains("SKIPPED") {
        println!(
            "SKIPPED a_peer_in_another_network_namespace_uses_the_socket_path: {}",
            outs[1]
        );
        return;
    }
    assert!(outs[1].contains("via path"), "{}", outs[1]);
    assert!(outs[1].contains("diagnosis checked"), "{}", outs[1]);
}

#[test]
fn a_denied_pidfd_rung_is_diagnosed_and_sockets_need_no_ptrace() {
    // The importer runs as root without CAP_SYS_PTRACE: the kernel refuses it ptrace access to
    // the exporter (whose capabilities exceed its own), so pidfd_getfd gives EPERM.
    let outs = run("pidfd_denied", 2, |r| {
        if r == 1 {
            vec![
                "setpriv",
                "--bounding-set=-sys_ptrace",
                "--inh-caps=-sys_ptrace",
                "--",
            ]
        } else {
            vec![]
        }
    });
    assert!(
        outs[1].contains("socket rung without CAP_SYS_PTRACE"),
        "{}",
        outs[1]
    );
    assert!(outs[1].contains("diagnosis checked"), "{}", outs[1]);
}

/// The attack of a local process that found the responders in `/proc/net/unix`: one of another
/// uid (65534), which even knows the responder's secret, and one of this uid outside the job
/// (which does not), each asking the abstract socket, the socket file and `pidfd_getfd` for the
/// registered descriptor (its serial, and serials 1..64). Neither gets a descriptor; the job's
/// own fetch works afterwards and the memory is untouched.
#[test]
fn processes_outside_the_job_get_nothing_and_the_job_goes_on() {
    let outs = run("guarded", 2, |_| vec![]);
    assert!(outs[0].contains("exporter unaffected"), "{}", outs[0]);
    assert!(outs[1].contains("fetched after strangers"), "{}", outs[1]);
    if outs[1].contains("SKIPPED") {
        println!("SKIPPED the other-uid stranger (not root): {}", outs[1]);
    } else {
        assert!(outs[1].contains("uid 65534 got nothing"), "{}", outs[1]);
    }
    assert!(
        outs[1].contains("same-uid outsider got nothing"),
        "{}",
        outs[1]
    );
}

#[test]
fn a_closed_responder_gives_an_error_not_sigpipe() {
    let outs = run("sigpipe", 1, |_| vec![]);
    assert!(outs[0].contains("survived"), "{}", outs[0]);
}

#[test]
fn a_killed_exporters_socket_file_is_reclaimed() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id("killed");
    let dir = socket_dir(&job);
    let mut child = spawn("hold", 0, 1, server.port(), &job, &dir, &[]);
    let store = client(server.port());
    store
        .wait(&[&record_key(&prefix(&job), 0)], T)
        .expect("the holder publishes its record");
    let left = sockets_in(&dir);
    assert_eq!(left.len(), 1, "{left:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(sockets_in(&dir), left, "SIGKILL runs no exit handler");
    let config = FdPassConfig {
        socket_dir: Some(dir.clone()),
        ..FdPassConfig::default()
    };
    let next = FdPass::new(Arc::new(store), &prefix(&job), &job, 1, config);
    next.start().unwrap();
    let now = sockets_in(&dir);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(
        now, left,
        "the dead holder's socket file is gone, ours is there"
    );
    drop(next);
    assert!(
        sockets_in(&dir).is_empty(),
        "dropping removes our socket file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn timeouts_are_bounded() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let store: Arc<dyn Store> = Arc::new(client(server.port()));
    let job = job_id("timeout");
    let config = FdPassConfig {
        socket_dir: None,
        rungs: vec![Rung::Abstract],
        ..FdPassConfig::default()
    };
    let fp = FdPass::new(store.clone(), &prefix(&job), &job, 0, config);
    let id = FdId {
        serial: 1,
        fd: 3,
        dev: 0,
        ino: 0,
    };

    // A peer that never publishes its record.
    let start = Instant::now();
    let e = fp.fetch(7, &id, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        e.message.contains("peer rank 7") && e.message.contains(&record_key(&prefix(&job), 7)),
        "{e}"
    );

    // A "responder" that accepts and never answers.
    let name = format!("nvfipc-test-silent-{}", std::process::id());
    let listener = std::os::unix::net::UnixListener::bind_addr(
        &SocketAddr::from_abstract_name(&name).unwrap(),
    )
    .unwrap();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(1) {
            conns.push(c.unwrap());
        }
        std::thread::sleep(Duration::from_secs(3));
    });
    let silent = PeerRecord {
        who: LocalIdentity::current(),
        nonce: 5,
        secret: Secret(5),
        abstract_name: name,
        path: Err("none".into()),
        ptracer: PtracerState::NotNeeded,
    };
    store
        .set(&record_key(&prefix(&job), 8), silent.encode().as_bytes())
        .unwrap();
    let start = Instant::now();
    let e = fp.fetch(8, &id, Duration::from_millis(500)).unwrap_err();
    let took = start.elapsed();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        e.message.contains("timed out") && e.message.contains("peer rank 8"),
        "{e}"
    );
    held.join().unwrap();

    // A peer in another PID namespace: the pidfd rung is ruled out with its reason.
    let pidfd_only = FdPassConfig {
        socket_dir: None,
        rungs: vec![Rung::Pidfd],
        ..FdPassConfig::default()
    };
    let fp = FdPass::new(store.clone(), &prefix(&job), &job, 0, pidfd_only);
    let mut elsewhere = silent.clone();
    elsewhere.who.pid_ns += 1;
    store
        .set(&record_key(&prefix(&job), 9), elsewhere.encode().as_bytes())
        .unwrap();
    let e = fp.fetch(9, &id, Duration::from_millis(300)).unwrap_err();
    assert!(
        e.message.contains("different PID namespace") && e.message.contains("--pid=host"),
        "{e}"
    );
}

#[test]
fn a_busy_responder_is_retried_and_a_restarted_peer_is_found_again() {
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let store: Arc<dyn Store> = Arc::new(client(server.port()));
    let job = job_id("busy");
    let dir = socket_dir(&job);
    let exporter_config = FdPassConfig {
        socket_dir: Some(dir.clone()),
        max_connections: 1,
        ..FdPassConfig::default()
    };
    let exporter = FdPass::new(
        store.clone(),
        &prefix(&job),
        &job,
        0,
        exporter_config.clone(),
    );
    let file = filled_memfd(3, 4096);
    let id = exporter.register_dup(&file).unwrap();
    let record = exporter.record().unwrap();

    // The one connection slot is taken; the importer is told "busy" until it frees.
    let hog = raw(&record);
    let importer_config = FdPassConfig {
        socket_dir: Some(dir.clone()),
        rungs: vec![Rung::Abstract, Rung::Path],
        connect_retry: Duration::from_secs(2),
        ..FdPassConfig::default()
    };
    let importer = FdPass::new(store.clone(), &prefix(&job), &job, 1, importer_config);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(hog);
    });
    let got = importer.fetch_diagnosed(0, &[id], T).unwrap();
    release.join().unwrap();
    assert_eq!(got.rung, Rung::Abstract, "{}", got.fell_back);
    assert_eq!(read_all(&got.fds[0], 4096), pattern(3, 4096));
    let (_, sent, refused, _, _) = exporter.responder_stats().unwrap();
    assert_eq!(sent, 1);
    assert!(refused >= 1, "the importer was told busy at least once");

    // The exporter restarts its transport (new nonce, new names); the importer's cached record
    // is stale, fails, is read again and the fetch succeeds within the same call.
    drop(exporter);
    assert!(
        !store.check(&[&record_key(&prefix(&job), 0)]).unwrap(),
        "record withdrawn"
    );
    let exporter = FdPass::new(store.clone(), &prefix(&job), &job, 0, exporter_config);
    let file = filled_memfd(4, 4096);
    let id = exporter.register_dup(&file).unwrap();
    assert_ne!(exporter.record().unwrap().nonce, record.nonce);
    let got = importer.fetch_diagnosed(0, &[id], T).unwrap();
    assert_eq!(got.rung, Rung::Abstract);
    assert!(
        got.fell_back.what.contains("after its record changed"),
        "{}",
        got.fell_back.what
    );
    assert_eq!(read_all(&got.fds[0], 4096), pattern(4, 4096));
    drop(exporter);
    assert!(sockets_in(&dir).is_empty(), "{:?}", sockets_in(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------------------------
// Rank side
// ------------------------------------------------------------------------------------------------

fn client(port: u16) -> TcpStore {
    TcpStore::connect("127.0.0.1", port, &ConnectOptions::default()).expect("connect to store")
}

fn prefix(job: &str) -> String {
    format!("fdtest/{job}")
}

fn pattern(seed: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i * 13 + seed * 101 + 7) as u8)
        .collect()
}

/// A shared, writable mapping of a whole file; unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: &OwnedFd, len: usize) -> Map {
        // SAFETY: a fresh MAP_SHARED mapping of `len` bytes of an open file; the kernel picks
        // the address, and the result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Map {
            ptr: ptr.cast(),
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes for as long as `self` lives, and `&mut self` makes this
        // the only view of them in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

struct Rank {
    rank: usize,
    world: usize,
    job: String,
    store: Arc<dyn Store>,
}

impl Rank {
    fn key(&self, name: &str) -> String {
        format!("{}/test/{name}", prefix(&self.job))
    }

    fn fdpass(&self, config: FdPassConfig) -> FdPass {
        FdPass::new(
            self.store.clone(),
            &prefix(&self.job),
            &self.job,
            self.rank,
            config,
        )
    }

    fn env_fdpass(&self) -> FdPass {
        self.fdpass(FdPassConfig::from_env().unwrap())
    }

    /// Publishes the ids under `name`.
    fn publish(&self, name: &str, ids: &[FdId]) {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.encode()).collect();
        self.store.set(&self.key(name), &bytes).unwrap();
    }

    fn ids(&self, name: &str) -> Vec<FdId> {
        let bytes = self.store.get(&self.key(name), T).unwrap();
        bytes
            .chunks(fdpass::FD_ID_LEN)
            .map(|c| FdId::decode(c).expect("an fd id"))
            .collect()
    }

    /// Every other rank says it is done; then returns.
    fn done(&self) {
        let n = self.store.add(&self.key("done"), 1).unwrap();
        if n == self.world as i64 {
            self.store.set(&self.key("all_done"), b"1").unwrap();
        }
        self.store.wait(&[&self.key("all_done")], T).unwrap();
    }
}

/// A memfd of `bytes` bytes holding `pattern(seed)`.
fn filled_memfd(seed: usize, bytes: usize) -> File {
    let file = File::from(memfd::create_reserved(&format!("fdtest-{seed}"), bytes as u64).unwrap());
    file.write_all_at(&pattern(seed, bytes), 0).unwrap();
    file
}

fn read_all(fd: &OwnedFd, bytes: usize) -> Vec<u8> {
    let file = File::from(fd.try_clone().unwrap());
    let mut got = vec![0u8; bytes];
    file.read_exact_at(&mut got, 0).unwrap();
    got
}

const MEMFD_BYTES: usize = 1 << 20;

fn scenario_memfd(r: &Rank) {
    let fp = r.env_fdpass();
    if r.rank == 0 {
        let file = filled_memfd(0, MEMFD_BYTES);
        let id = fp.register_dup(&file).unwrap();
        r.publish("id", &[id]);
        r.done();
        let mut second = vec![0u8; MEMFD_BYTES / 2];
        file.read_exact_at(&mut second, (MEMFD_BYTES / 2) as u64)
            .unwrap();
        assert_eq!(second, pattern(1, MEMFD_BYTES / 2), "the importer's write");
        println!("exporter saw the importer's write");
    } else {
        let id = r.ids("id")[0];
        let got = fp.fetch_diagnosed(0, &[id], T).unwrap();
        println!("via {}", got.rung.name());
        assert_eq!(got.rung, Rung::Abstract, "{}", got.fell_back);
        assert!(got.fell_back.rungs.is_empty(), "{}", got.fell_back);
        let fd = got.fds.into_iter().next().unwrap();
        let mut map = Map::new(&fd, MEMFD_BYTES);
        assert_eq!(
            &map.bytes()[..],
            &pattern(0, MEMFD_BYTES)[..],
            "contents through mmap"
        );
        map.bytes()[MEMFD_BYTES / 2..].copy_from_slice(&pattern(1, MEMFD_BYTES / 2));
        // The pidfd rung alone (this process may ptrace its sibling here).
        let pidfd = r.fdpass(FdPassConfig {
            rungs: vec![Rung::Pidfd],
            ..FdPassConfig::from_env().unwrap()
        });
        let got = pidfd.fetch_diagnosed(0, &[id], T).unwrap();
        assert_eq!(got.rung, Rung::Pidfd);
        assert_eq!(read_all(&got.fds[0], 4096), pattern(0, 4096));
        println!("pidfd rung delivered");
        r.done();
    }
}

const MANY: usize = 64;
const THREADS: usize = 4;

fn scenario_many(r: &Rank) {
    let fp = Arc::new(r.env_fdpass());
    if r.rank == 0 {
        let mut ids = Vec::new();
        for i in 0..MANY {
            ids.push(
                fp.register(OwnedFd::from(filled_memfd(i, 4096 + i)))
                    .unwrap(),
            );
        }
        let gone = fp.register(OwnedFd::from(filled_memfd(999, 16))).unwrap();
        assert!(fp.unregister(&gone));
        r.publish("ids", &ids);
        r.publish("gone", &[gone]);
        r.done();
        let (accepted, sent, refused, malformed, _) = fp.responder_stats().unwrap();
        println!(
            "accepted {accepted}, served {sent} fds, refused {refused}, malformed {malformed}"
        );
        let importers = r.world - 1;
        assert_eq!(sent as usize, importers * THREADS * MANY);
        assert_eq!(
            refused as usize,
            importers * 2,
            "a revoked and an unknown id each"
        );
        assert_eq!(malformed, 0);
        assert_eq!(fp.registered(), MANY);
    } else {
        let ids = Arc::new(r.ids("ids"));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fp, ids) = (fp.clone(), ids.clone());
                std::thread::spawn(move || {
                    let fds = if t % 2 == 0 {
                        fp.fetch_many(0, &ids, T).unwrap()
                    } else {
                        ids.iter()
                            .rev()
                            .map(|id| fp.fetch(0, id, T).unwrap())
                            .rev()
                            .collect()
                    };
                    for (i, fd) in fds.iter().enumerate() {
                        assert_eq!(read_all(fd, 4096 + i), pattern(i, 4096 + i), "id {i}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("an importer thread");
        }
        let gone = r.ids("gone")[0];
        let e = fp.fetch(0, &gone, T).unwrap_err();
        assert_eq!(e.status, Status::NotFound, "{e}");
        assert!(
            e.message.contains("revoked") && e.message.contains("unregistered"),
            "{e}"
        );
        let never = FdId {
            serial: 1_000_000,
            ..gone
        };
        let e = fp.fetch(0, &never, T).unwrap_err();
        assert_eq!(e.status, Status::NotFound, "{e}");
        assert!(
            e.message.contains("unknown id") && e.message.contains("was ever registered"),
            "{e}"
        );
        // A definitive answer ends the ladder: pidfd_getfd was not tried.
        assert!(!e.message.contains("pidfd_getfd"), "{e}");
        r.done();
    }
}

fn read_reply(s: &mut UnixStream) -> Option<Reply> {
    let mut input = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        if let Ok(Parsed::Frame(reply, _)) = Reply::decode(&input) {
            return Some(reply);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => input.extend_from_slice(&buf[..n]),
        }
    }
}

fn raw(record: &PeerRecord) -> UnixStream {
    let addr = SocketAddr::from_abstract_name(&record.abstract_name).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s
}

fn expect_error(reply: Option<Reply>, code: ErrorCode, needle: &str) {
    match reply {
        Some(Reply::Error {
            code: got, message, ..
        }) => {
            assert_eq!(got, code, "{message}");
            assert!(message.contains(needle), "{needle}: {message}");
        }
        other => panic!("expected a {code:?} error, got {other:?}"),
    }
}

fn scenario_malformed(r: &Rank) {
    let fp = r.env_fdpass();
    if r.rank == 0 {
        let file = filled_memfd(5, 8192);
        let id = fp.register_dup(&file).unwrap();
        r.publish("id", &[id]);
        r.done();
        let (_, sent, refused, malformed, _) = fp.responder_stats().unwrap();
        println!("sent={sent} refused={refused} malformed={malformed}");
        assert!(fp.responder_running());
    } else {
        let id = r.ids("id")[0];
        let record = fp.peer_record(0, Instant::now() + T).unwrap();
        let good = FetchRequest {
            nonce: record.nonce,
            serial: id.serial,
            rank: 1,
            pid: std::process::id(),
            secret: record.secret,
        };
        // Held open and silent throughout: it must not stall anybody.
        let _silent = raw(&record);

        let mut s = raw(&record);
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        expect_error(read_reply(&mut s), ErrorCode::Malformed, "magic");
        assert!(
            read_reply(&mut s).is_none(),
            "closed after a malformed request"
        );

        let mut s = raw(&record);
        let mut v9 = good.encode();
        v9[4] = 9;
        s.write_all(&v9).unwrap();
        expect_error(
            read_reply(&mut s),
            ErrorCode::UnsupportedVersion,
            "version 9",
        );

        let mut s = raw(&record);
        let mut huge = good.encode();
        huge[8..12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        s.write_all(&huge[..12]).unwrap();
        expect_error(read_reply(&mut s), ErrorCode::Malformed, "exceeds");

        // Half a frame, then gone.
        let mut s = raw(&record);
        s.write_all(&good.encode()[..7]).unwrap();
        drop(s);

        // A wrong nonce is refused, and the connection goes on serving.
        let mut s = raw(&record);
        s.write_all(&FetchRequest { nonce: 1, ..good }.encode())
            .unwrap();
        expect_error(read_reply(&mut s), ErrorCode::WrongNonce, "stale");
        let mut two = good.encode();
        two.extend_from_slice(&good.encode());
        s.write_all(&two).unwrap();
        for _ in 0..2 {
            match read_reply(&mut s) {
                Some(Reply::Fd { serial, .. }) => assert_eq!(serial, id.serial),
                other => panic!("expected an fd reply, got {other:?}"),
            }
        }

        let fd = fp.fetch(0, &id, T).unwrap();
        assert_eq!(read_all(&fd, 8192), pattern(5, 8192));
        println!("fetched after abuse");
        r.done();
    }
}

/// Moves this thread into a network namespace of its own; `Err` says why it could not.
fn own_network_namespace() -> Result<(), String> {
    // SAFETY: unshare takes flags by value; CLONE_NEWNET affects only the calling thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNET) failed ({}): run as root or allow unprivileged namespaces",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn scenario_netns(r: &Rank) {
    if r.rank == 0 {
        let fp = r.env_fdpass();
        let file = filled_memfd(7, 65536);
        let id = fp.register_dup(&file).unwrap();
        r.publish("id", &[id]);
        r.done();
        return;
    }
    let id = r.ids("id")[0];
    let before = LocalIdentity::current();
    // The store connection made above keeps working from the new namespace.
    if let Err(why) = own_network_namespace() {
        println!("SKIPPED: {why}");
        r.done();
        return;
    }
    let fp = r.env_fdpass();
    let here = LocalIdentity::current();
    assert_ne!(here.net_ns, before.net_ns, "a network namespace of its own");
    let got = fp.fetch_diagnosed(0, &[id], T).unwrap();
    println!("via {}", got.rung.name());
    assert_eq!(got.rung, Rung::Path, "{}", got.fell_back);
    assert!(
        matches!(
            got.fell_back.gate(Rung::Abstract),
            Some(Gate::OtherNetNamespace { .. })
        ),
        "{}",
        got.fell_back
    );
    let mut map = Map::new(&got.fds[0], 65536);
    assert_eq!(&map.bytes()[..], &pattern(7, 65536)[..]);

    // The socket directory not shared (its file absent here), socket rungs only.
    let record = fp.peer_record(0, Instant::now() + T).unwrap();
    let path = record.path.clone().unwrap();
    std::fs::remove_file(&path).unwrap();
    let sockets_only = r.fdpass(FdPassConfig {
        rungs: vec![Rung::Abstract, Rung::Path],
        connect_retry: Duration::from_millis(200),
        ..FdPassConfig::from_env().unwrap()
    });
    let start = Instant::now();
    let e = sockets_only.fetch(0, &id, T).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    for needle in [
        "rank 1 of job",
        "peer rank 0",
        "different network namespace",
        "pidfd_getfd pid",
        "not enabled",
        &path.display().to_string(),
        "does not exist",
        "NVFIPC_SOCKET_DIR",
    ] {
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
    println!("diagnosis checked: {e}");
    r.done();
}

fn scenario_pidfd_denied(r: &Rank) {
    let fp = r.env_fdpass();
    if r.rank == 0 {
        let file = filled_memfd(9, 4096);
        let id = fp.register_dup(&file).unwrap();
        r.publish("id", &[id]);
        r.done();
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        caps & (1 << 19),
        0,
        "this rank must run without CAP_SYS_PTRACE"
    );
    let id = r.ids("id")[0];
    let got = fp.fetch_diagnosed(0, &[id], T).unwrap();
    assert_eq!(got.rung, Rung::Abstract);
    assert_eq!(read_all(&got.fds[0], 4096), pattern(9, 4096));
    println!("socket rung without CAP_SYS_PTRACE delivered");

    let pidfd_only = r.fdpass(FdPassConfig {
        rungs: vec![Rung::Pidfd],
        ..FdPassConfig::from_env().unwrap()
    });
    let e = pidfd_only.fetch(0, &id, T).unwrap_err();
    for needle in [
        "rank 1 of job",
        "peer rank 0",
        "pidfd_getfd",
        &format!("fd {}", id.fd),
        "EPERM",
        "CAP_SYS_PTRACE",
        "socket rungs",
        "abstract socket",
        "not enabled",
    ] {
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
    println!("diagnosis checked: {e}");
    r.done();
}

/// With SIGPIPE at its default action (as in a C++ host), an importer whose responder closes
/// while the request is being written gets an error, not a fatal signal.
fn scenario_sigpipe(r: &Rank) {
    // SAFETY: sets this process's SIGPIPE disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let name = format!("nvfipc-test-closer-{}", std::process::id());
    let listener = std::os::unix::net::UnixListener::bind_addr(
        &SocketAddr::from_abstract_name(&name).unwrap(),
    )
    .unwrap();
    let closer = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(conn);
    });
    let record = PeerRecord {
        who: LocalIdentity::current(),
        nonce: 5,
        secret: Secret(5),
        abstract_name: name,
        path: Err("none".into()),
        ptracer: PtracerState::NotNeeded,
    };
    r.store
        .set(&record_key(&prefix(&r.job), 1), record.encode().as_bytes())
        .unwrap();
    let fp = r.fdpass(FdPassConfig {
        rungs: vec![Rung::Abstract],
        ..FdPassConfig::from_env().unwrap()
    });
    // 20000 requests (720 kB) cannot all fit in the socket buffer: the write is still going
    // when the other side closes.
    let ids: Vec<FdId> = (1..=20_000)
        .map(|serial| FdId {
            serial,
            fd: 3,
            dev: 0,
            ino: 0,
        })
        .collect();
    let e = fp.fetch_many(1, &ids, T).unwrap_err();
    closer.join().unwrap();
    assert!(
        e.message.contains("Broken pipe") || e.message.contains("reset"),
        "{e}"
    );
    println!("survived: {e}");
}

const GUARDED: usize = 4096;
/// Connections the strangers make that the exporter must deny: the other uid's abstract one
/// (its socket file is out of reach), the outsider's abstract and path ones.
const DENIED: u64 = 3;

fn scenario_guarded(r: &Rank) {
    let fp = r.env_fdpass();
    if r.rank == 0 {
        let file = filled_memfd(11, GUARDED);
        let id = fp.register_dup(&file).unwrap();
        assert_ne!(
            fp.record().unwrap().ptracer,
            PtracerState::Any,
            "no PR_SET_PTRACER_ANY unless asked for"
        );
        r.publish("id", &[id]);
        r.done();
        let (_, sent, _, malformed, denied) = fp.responder_stats().unwrap();
        println!("sent={sent} denied={denied} malformed={malformed}");
        assert_eq!(sent, 1, "only the job's own fetch got a descriptor");
        let expected = if is_root() { DENIED } else { DENIED - 1 };
        assert_eq!(denied, expected);
        assert!(fp.responder_running());
        let mut now = vec![0u8; GUARDED];
        file.read_exact_at(&mut now, 0).unwrap();
        assert_eq!(now, pattern(11, GUARDED), "nobody wrote into it");
        println!("exporter unaffected");
        return;
    }
    let id = r.ids("id")[0];
    let record = fp.peer_record(0, Instant::now() + T).unwrap();
    let target = |with_secret: bool| {
        let mut env = vec![
            ("NVFIPC_T_ABSTRACT", record.abstract_name.clone()),
            (
                "NVFIPC_T_PATH",
                record.path.clone().unwrap().display().to_string(),
            ),
            ("NVFIPC_T_NONCE", record.nonce.to_string()),
            ("NVFIPC_T_SERIAL", id.serial.to_string()),
            ("NVFIPC_T_FD", id.fd.to_string()),
            ("NVFIPC_T_PID", record.who.pid.to_string()),
        ];
        if with_secret {
            env.push(("NVFIPC_T_SECRET", record.secret.to_hex()));
        }
        env
    };
    if is_root() {
        let out = run_stranger(Some(65534), &target(true));
        assert!(out.contains("got nothing"), "{out}");
        println!("uid 65534 got nothing:\n{out}");
    } else {
        println!("SKIPPED: not root, cannot start a process of another uid");
    }
    let out = run_stranger(None, &target(false));
    assert!(out.contains("got nothing"), "{out}");
    println!("same-uid outsider got nothing:\n{out}");

    let got = fp.fetch_diagnosed(0, &[id], T).unwrap();
    assert_eq!(got.rung, Rung::Abstract, "{}", got.fell_back);
    assert_eq!(read_all(&got.fds[0], GUARDED), pattern(11, GUARDED));
    println!("fetched after strangers");
    r.done();
}

fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs the `stranger` role in a new process: as `uid` (and its gid, no supplementary groups)
/// from a copy of this binary that uid can execute, or as this uid; returns its output.
fn run_stranger(uid: Option<u32>, env: &[(&str, String)]) -> String {
    let results = Ranks {
        children: vec![stranger_command(uid, "stranger", env)
            .spawn()
            .expect("spawn the stranger")],
    }
    .collect(Duration::from_secs(60));
    if uid.is_some() {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("nvfipc-stranger-{}", std::process::id())),
        );
    }
    let (ok, out) = results.into_iter().next().unwrap();
    assert!(ok, "the stranger failed:\n{out}");
    out
}

/// The command of a process in `role`, as `uid` when given (see [`run_stranger`]).
fn stranger_command(uid: Option<u32>, role: &str, env: &[(&str, String)]) -> Command {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = match uid {
        Some(uid) => {
            // The build directory may be closed to other users: run a copy from a directory
            // they may enter.
            let dir = std::env::temp_dir().join(format!("nvfipc-stranger-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let copy = dir.join("stranger");
            std::fs::copy(&exe, &copy).unwrap();
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
            let mut c = Command::new(copy);
            // std drops supplementary groups when root changes the uid.
            c.uid(uid).gid(uid);
            c
        }
        None => Command::new(&exe),
    };
    cmd.current_dir("/")
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The attack of a process of another uid that knows only the store's port: it takes rank 0's
/// place in the store (its own responder's record under `fdpass/0`, serving anyone), offers its
/// own memory, and writes a record notice under a key rank 1 reads. Rank 1 (this process) takes
/// nothing from it, by any rung: the kernel says the responder runs as another uid.
#[test]
fn an_impostor_of_another_uid_named_by_the_store_feeds_no_record_and_no_memory() {
    if !is_root() {
        println!("SKIPPED: not root, cannot start a process of another uid");
        return;
    }
    let server = StoreServer::bind("127.0.0.1", 0).expect("store server");
    let job = job_id("impostor");
    let key = format!("{}/g1/h/0/1/0/2/x#0", prefix(&job));
    let env = [
        ("NVFIPC_T_PORT", server.port().to_string()),
        ("NVFIPC_T_JOB", job.clone()),
        ("NVFIPC_T_KEY", key.clone()),
        // Its responder serves root (this process): the impostor wants to be asked.
        ("NVFIPC_TRUSTED_UIDS", "0".to_string()),
        ("NVFIPC_SOCKET_DIR", "none".to_string()),
    ];
    let mut impostor = Ranks {
        children: vec![stranger_command(Some(65534), "impostor", &env)
            .spawn()
            .expect("spawn the impostor")],
    };
    let store: Arc<dyn Store> = Arc::new(client(server.port()));
    let notice = store.get(&key, T).expect("the impostor's notice");
    let memfd_id = FdId::decode(&store.get(&format!("{key}/memfd"), T).unwrap()).unwrap();
    for rungs in [
        vec![Rung::Abstract, Rung::Path, Rung::Pidfd],
        vec![Rung::Pidfd],
    ] {
        let config = FdPassConfig {
            rungs: rungs.clone(),
            ..FdPassConfig::default()
        };
        let victim = FdPass::new(store.clone(), &prefix(&job), &job, 1, config);
        let err = victim.open_record(0, &key, &notice, T).unwrap_err();
        assert_eq!(err.status, Status::Protocol, "{rungs:?}: {}", err.message);
        assert!(err.message.contains("runs as uid 65534"), "{}", err.message);
        let err = victim.fetch(0, &memfd_id, T).unwrap_err();
        assert!(err.message.contains("runs as uid 65534"), "{}", err.message);
        println!("{rungs:?}: refused: {}", err.message);
    }
    store.set(&format!("{key}/done"), b"1").unwrap();
    let (ok, out) = impostor.collect(Duration::from_secs(60)).remove(0);
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("nvfipc-stranger-{}", std::process::id())),
    );
    assert!(ok && out.contains("impostor in place"), "{out}");
}

/// The impostor of the test above, running as another uid.
fn impostor() {
    let var = |k: &str| std::env::var(k).unwrap();
    let job = var("NVFIPC_T_JOB");
    let key = var("NVFIPC_T_KEY");
    let store: Arc<dyn Store> = Arc::new(client(var("NVFIPC_T_PORT").parse().unwrap()));
    let config = FdPassConfig::from_env().unwrap();
    let fp = Arc::new(FdPass::new(store.clone(), &prefix(&job), &job, 0, config));
    fp.start().unwrap();
    let mem = memfd::create_reserved("pwned", 4096).unwrap();
    File::from(mem.try_clone().unwrap())
        .write_all_at(b"PWNED-by-uid-65534", 0)
        .unwrap();
    let id = fp.register(mem).unwrap();
    let (notice, _sealed) = fp.seal_record(&key, b"a forged record").unwrap();
    store.set(&format!("{key}/memfd"), &id.encode()).unwrap();
    store.set(&key, &notice).unwrap();
    println!("impostor in place");
    store.get(&format!("{key}/done"), T).unwrap();
}

/// What came back on one connection: the replies and how many descriptors rode with them.
struct Knock {
    replies: Vec<Reply>,
    fds: usize,
    closed: bool,
}

/// Connects to `addr`, sends `bytes`, and reads until the responder closes or resets the
/// connection (or 5 s pass), counting every descriptor that arrives (and closing it).
fn knock(addr: &SocketAddr, bytes: &[u8]) -> std::io::Result<Knock> {
    let mut s = UnixStream::connect_addr(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The responder may close before all is written: EPIPE (SIGPIPE is ignored by Rust).
    let _ = s.write_all(bytes);
    let mut input = Vec::new();
    let mut fds = 0;
    let closed = loop {
        let mut buf = [0u8; 4096];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 64];
        // SAFETY: an all-zero msghdr is a valid empty header; it is then pointed at `iov`
        // (covering `buf`) and `control`, both writable and alive across the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: as above; the socket is open.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            // A socket closed with unread requests in it resets the connection: closed too.
            let e = std::io::Error::last_os_error();
            break e.raw_os_error() == Some(libc::ECONNRESET);
        }
        // SAFETY: the kernel filled `control` up to msg_controllen; the CMSG macros walk only
        // headers inside it, and each SCM_RIGHTS header holds fds installed here, closed once.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let data = libc::CMSG_DATA(c).cast::<i32>();
                    for i in 0..len / 4 {
                        libc::close(std::ptr::read_unaligned(data.add(i)));
                        fds += 1;
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 {
            break true;
        }
        input.extend_from_slice(&buf[..n as usize]);
    };
    let mut replies = Vec::new();
    while let Ok(Parsed::Frame(reply, used)) = Reply::decode(&input) {
        input.drain(..used);
        replies.push(reply);
    }
    Ok(Knock {
        replies,
        fds,
        closed,
    })
}

/// A process outside the trust boundary: finds the responder in /proc/net/unix as an attacker
/// would, then asks for the descriptor every way there is. Prints "got nothing" or panics.
fn stranger() {
    let var = |k: &str| std::env::var(k).unwrap();
    let abstract_name = var("NVFIPC_T_ABSTRACT");
    let path = PathBuf::from(var("NVFIPC_T_PATH"));
    let nonce: u64 = var("NVFIPC_T_NONCE").parse().unwrap();
    let serial: u64 = var("NVFIPC_T_SERIAL").parse().unwrap();
    let fd: i32 = var("NVFIPC_T_FD").parse().unwrap();
    let pid: u32 = var("NVFIPC_T_PID").parse().unwrap();
    let secret = std::env::var("NVFIPC_T_SECRET")
        .ok()
        .map(|h| Secret::from_hex(&h).unwrap());
    // SAFETY: getuid/geteuid take no arguments and cannot fail.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    println!("stranger pid {} uid {uid} euid {euid}", std::process::id());

    // The names are public; the secret is not.
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    assert!(
        table.contains(&format!("@{abstract_name}")),
        "the abstract name is listed in /proc/net/unix"
    );
    if let Some(secret) = secret {
        assert!(!table.contains(&secret.to_hex()));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains(&secret.to_hex()));
    }

    // The registered serial and the small ones, with the right nonce and (for the other uid)
    // even the right secret.
    let mut requests = Vec::new();
    for s in std::iter::once(serial).chain(1..=64) {
        let req = FetchRequest {
            nonce,
            serial: s,
            rank: 0,
            pid: std::process::id(),
            secret: secret.unwrap_or(Secret(0)),
        };
        requests.extend_from_slice(&req.encode());
    }
    let routes = [
        (
            "abstract",
            SocketAddr::from_abstract_name(&abstract_name).unwrap(),
        ),
        ("path", SocketAddr::from_pathname(&path).unwrap()),
    ];
    for (what, addr) in &routes {
        match knock(addr, &requests) {
            Ok(k) => {
                assert_eq!(k.fds, 0, "{what}: a descriptor reached a stranger");
                assert!(k.closed, "{what}: the responder closed the connection");
                assert!(
                    matches!(
                        k.replies.as_slice(),
                        [Reply::Error {
                            code: ErrorCode::Denied,
                            ..
                        }]
                    ),
                    "{what}: one denial and nothing else: {:?}",
                    k.replies
                );
                if let Reply::Error { message, .. } = &k.replies[0] {
                    if let Some(secret) = secret {
                        assert!(!message.contains(&secret.to_hex()));
                    }
                    println!("{what}: denied: {message}");
                }
            }
            Err(e) => {
                assert!(
                    *what == "path" && e.kind() == std::io::ErrorKind::PermissionDenied,
                    "{what}: {e}"
                );
                println!("{what}: cannot connect: {e}");
            }
        }
    }

    // pidfd_getfd of the registered descriptor number: the kernel's ptrace rules decide. A
    // process of another uid without CAP_SYS_PTRACE is refused; root of this uid is not (root
    // is inside the boundary anyway), so that case is only tried for another uid.
    if uid != 0 {
        // SAFETY: pidfd_open takes a pid and flags by value.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if pidfd >= 0 {
            // SAFETY: pidfd_getfd takes two descriptor numbers and flags by value.
            let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd as i32, fd, 0) };
            let err = std::io::Error::last_os_error();
            assert!(got < 0, "pidfd_getfd gave a stranger the descriptor");
            println!("pidfd_getfd: {err}");
            // SAFETY: `pidfd` is a descriptor this process opened and closes once.
            unsafe { libc::close(pidfd as i32) };
        }
    }
    println!("got nothing");
}

/// Registers one descriptor and sleeps until killed.
fn scenario_hold(r: &Rank) {
    let fp = r.env_fdpass();
    let _id = fp
        .register(memfd::create_reserved("hold", 4096).unwrap())
        .unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
#[ignore = "a rank process of the cross-process tests, started by them"]
fn child() {
    let Ok(scenario) = std::env::var(ROLE) else {
        return;
    };
    if scenario == "stranger" {
        return stranger();
    }
    if scenario == "impostor" {
        return impostor();
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let port: u16 = var("NVFIPC_T_PORT").parse().unwrap();
    let r = Rank {
        rank: var("NVFIPC_T_RANK").parse().unwrap(),
        world: var("NVFIPC_T_WORLD").parse().unwrap(),
        job: var("NVFIPC_T_JOB"),
        store: Arc::new(client(port)),
    };
    let _ = std::io::stdout().flush();
    match scenario.as_str() {
        "memfd" => scenario_memfd(&r),
        "many" => scenario_many(&r),
        "malformed" => scenario_malformed(&r),
        "netns" => scenario_netns(&r),
        "pidfd_denied" => scenario_pidfd_denied(&r),
        "hold" => scenario_hold(&r),
        "sigpipe" => scenario_sigpipe(&r),
        "guarded" => scenario_guarded(&r),
        other => panic!("unknown scenario {other}"),
    }
}
