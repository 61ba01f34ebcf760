//! Interoperability with real PyTorch (torch.distributed.TCPStore), both directions:
//! torch's client against our embedded server, our client against torch's servers (libuv and
//! classic), and a 2-rank gloo job whose rendezvous runs through our server.
//!
//! Python comes from `NVFIPC_PYTHON` (a python with torch, e.g. `$(bash scripts/lib/python-env.sh)`).
//! Without it the tests print "skipped: ..." and pass, unless `NVFIPC_REQUIRE_TORCH=1`, in which
//! case a missing python or torch fails them. Every subprocess is bounded and killed on failure.

use nvfipc_store::Status;
use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::store::wire;
use nvfuser_ipc::tools::barrier::{barrier, BarrierState};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Upper bound for any one reply of a Python helper (torch import included, on a busy machine).
const LINE_TIMEOUT: Duration = Duration::from_secs(90);
/// Upper bound for a whole Python helper run.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(180);
const T: Duration = Duration::from_secs(20);

/// The python to use, or `None` (after printing why) when the tests should be skipped.
fn python(test: &str) -> Option<PathBuf> {
    static CHECKED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let Some(py) = std::env::var_os("NVFIPC_PYTHON").filter(|p| !p.is_empty()) else {
            return Err(
                "NVFIPC_PYTHON is not set (use NVFIPC_PYTHON=$(bash scripts/lib/python-env.sh))"
                    .to_owned(),
            );
        };
        let out = Command::new(&py)
            .args([
                "-W",
                "ignore",
                "-c",
                "import torch.distributed as d; d.TCPStore; print(1)",
            ])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => Ok(PathBuf::from(py)),
            Ok(o) => Err(format!(
                "{} cannot import torch.distributed: {}",
                Path::new(&py).display(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => Err(format!("cannot run {}: {e}", Path::new(&py).display())),
        }
    });
    match checked {
        Ok(py) => Some(py.clone()),
        Err(why) if std::env::var("NVFIPC_REQUIRE_TORCH").is_ok_and(|v| v == "1") => {
            panic!("NVFIPC_REQUIRE_TORCH=1 but {why}")
        }
        Err(why) => {
            // Straight to stderr: the test harness would hide a println! of a passing test.
            let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
            None
        }
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

/// A Python helper process: its stdout lines arrive on a channel, stderr is kept for failure
/// messages, and it is killed when dropped.
struct Py {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Py {
    fn spawn(py: &Path, name: &str, args: &[&str]) -> Py {
        let mut child = Command::new(py)
            .arg("-W")
            .arg("ignore")
            .arg(script(name))
            .args(args)
            .env("GLOO_SOCKET_IFNAME", "lo")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Py {
            name: format!("{name} {}", args.join(" ")),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next stdout line; panics (with the helper's stderr) on timeout or exit.
    fn line(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!(
                "{}: no output within {timeout:?}; stderr:\n{}",
                self.name,
                self.stderr()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.wait(Duration::from_secs(10));
                panic!(
                    "{}: exited ({status:?}) before the expected output; stderr:\n{}",
                    self.name,
                    self.stderr()
                )
            }
        }
    }

    /// Skips lines until one starting with `prefix`; returns the rest of it.
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let line = self.line(LINE_TIMEOUT);
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// No line arrives within `d` (the process keeps running).
    fn silent_for(&mut self, d: Duration) -> bool {
        matches!(self.lines.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }

    /// Sends one command line and returns the reply line.
    fn cmd(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .unwrap();
        self.line(LINE_TIMEOUT)
    }

    /// Waits (bounded) for exit; kills the process when the time runs out.
    fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a successful exit, panicking with stderr otherwise.
    fn succeed(&mut self) {
        self.stdin.take();
        let status = self.wait(PROCESS_TIMEOUT);
        assert!(
            status.is_some_and(|s| s.success()),
            "{}: exit {status:?}; stderr:\n{}",
            self.name,
            self.stderr()
        );
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn opts() -> ConnectOptions {
    ConnectOptions::with_timeout(T)
}

/// Reads a wire key directly (no "/" prefix), e.g. "init/", with a raw connection.
fn raw_get(port: u16, wire_key: &str) -> Vec<u8> {
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let mut out = Vec::new();
    wire::encode_validate(&mut out);
    wire::encode_get(&mut out, wire_key).unwrap();
    sock.write_all(&out).unwrap();
    wire::read_blob(&mut sock).unwrap()
}

#[test]
fn torch_client_against_our_server() {
    let Some(py) = python("torch_client_against_our_server") else {
        return;
    };
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port();
    let rust = TcpStore::connect("127.0.0.1", port, &opts()).unwrap();
    rust.set("from_rust", b"\x00rust\xff").unwrap();

    let mut client = Py::spawn(&py, "torch_client.py", &[&port.to_string()]);
    let version = client.expect("torch ");
    client.expect("waiting rust_late");
    // torch's client is blocked in WAIT; our SET from another connection must wake it.
    std::thread::sleep(Duration::from_millis(100));
    rust.set("rust_late", b"late").unwrap();
    let msg = client.expect("wait timeout: ");
    assert!(
        msg.contains("wait timeout after 500ms, keys: /never"),
        "{msg}"
    );
    let barrier = client.expect("barrier: ");
    if torch_at_least(&version, 2, 15) {
        assert_eq!(
            barrier, "OK",
            "torch {version}: Store.barrier against our server"
        );
    }
    client.expect("OK");
    client.succeed();
    assert_eq!(server.stats().closed_malformed, 0, "{:?}", server.stats());

    // What torch wrote is visible to us, under torch's key layout.
    assert_eq!(rust.get("from_python", T).unwrap(), b"\xffpy\x00");
    assert_eq!(rust.get("pfx/k", T).unwrap(), b"pv");
    assert_eq!(rust.get("k", T).unwrap(), b"w+");
    // The world_size=2 client sent ADD "init/" 1 (wire key without "/").
    assert_eq!(raw_get(port, "init/"), b"1");
    assert!(!rust.check(&["init/"]).unwrap());
}

/// Whether a torch version string (`2.15.0+cu130`) is at least `major.minor`.
fn torch_at_least(version: &str, major: u32, minor: u32) -> bool {
    let mut parts = version
        .split(['.', '+'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let got = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    got >= (major, minor)
}

/// Our client against a torch server: every operation, cross-checked from Python.
/// Barriers and single arrivals through the server at `port`; `s` is a connected client.
fn barrier_rounds_and_arrivals(port: u16, s: &TcpStore) {
    // Barriers pipeline SET + WAIT (and DELETE_KEY x n + SET for the coordinator) on one
    // connection; the server must answer them in order, round after round.
    let state_per_rank: Vec<_> = (0..4).map(|_| BarrierState::scoped("interop")).collect();
    std::thread::scope(|scope| {
        let ranks: Vec<_> = state_per_rank
            .iter()
            .enumerate()
            .map(|(rank, state)| {
                scope.spawn(move || {
                    let c = TcpStore::connect("127.0.0.1", port, &opts()).unwrap();
                    for round in 0..20u64 {
                        assert_eq!(barrier(&c, state, rank, 4, None, T).unwrap(), round);
                    }
                    c.ping().unwrap();
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
    });
    // SET + WAIT in one message: a timeout cancels cleanly and leaves the stream in step;
    // DELETE_KEY x n + SET (+ WAIT) in one message: every reply is read.
    let err = s
        .update_then_wait(
            &[],
            Some(("lone/arrived", b"1")),
            &["lone/release"],
            Duration::from_millis(100),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::Timeout, "{err}");
    assert!(s.check(&["lone/arrived"]).unwrap());
    s.update_then_wait(
        &["lone/arrived", "lone/missing"],
        Some(("lone/release", b"go")),
        &[],
        T,
    )
    .unwrap();
    assert!(!s.check(&["lone/arrived"]).unwrap());
    s.set("lone/old", b"o").unwrap();
    s.update_then_wait(
        &["lone/old"],
        Some(("lone/again", b"2")),
        &["lone/release"],
        T,
    )
    .unwrap();
    assert!(!s.check(&["lone/old"]).unwrap());
    s.update_then_wait(&[], None, &[], T).unwrap();
    assert_eq!(s.get("lone/release", T).unwrap(), b"go");
    assert_eq!(s.get("lone/again", T).unwrap(), b"2");
    s.ping().unwrap();
}

fn our_client_against_torch_server(libuv: bool) {
    let Some(py) = python(&format!("our_client_against_torch_server(libuv={libuv})")) else {
        return;
    };
    let mut srv = Py::spawn(
        &py,
        "torch_server.py",
        &["--libuv", if libuv { "1" } else { "0" }],
    );
    let port: u16 = srv.expect("port ").trim().parse().unwrap();
    srv.expect("ready");
    let s = TcpStore::connect("127.0.0.1", port, &opts()).unwrap();
    s.ping().unwrap();

    // Values cross both ways, binary included.
    s.set("rust_bin", b"\x00\xff\x00rust").unwrap();
    assert_eq!(
        srv.cmd("get rust_bin"),
        format!("value {}", hex(b"\x00\xff\x00rust"))
    );
    assert_eq!(srv.cmd("set py_bin 00ff01"), "ok");
    assert_eq!(s.get("py_bin", T).unwrap(), b"\x00\xff\x01");
    s.set("empty", b"").unwrap();
    assert_eq!(s.get("empty", T).unwrap(), b"");
    assert_eq!(srv.cmd("get empty"), "value ");

    assert_eq!(s.add("n", 3).unwrap(), 3);
    assert_eq!(s.add("n", -5).unwrap(), -2);
    assert_eq!(srv.cmd("get n"), format!("value {}", hex(b"-2")));
    assert!(s.check(&["rust_bin", "py_bin"]).unwrap());
    assert!(!s.check(&["rust_bin", "nope"]).unwrap());
    assert_eq!(srv.cmd("check rust_bin py_bin n"), "true");

    // compare_set, every branch.
    assert_eq!(s.compare_set("c", b"", b"v1").unwrap(), b"v1");
    assert_eq!(s.compare_set("c", b"v1", b"v2").unwrap(), b"v2");
    assert_eq!(s.compare_set("c", b"bad", b"zz").unwrap(), b"v2");
    assert_eq!(s.compare_set("missing", b"e", b"x").unwrap(), b"e");
    assert!(!s.check(&["missing"]).unwrap());
    assert_eq!(srv.cmd("get c"), format!("value {}", hex(b"v2")));

    s.append("rust_bin", b"+").unwrap();
    assert_eq!(
        srv.cmd("get rust_bin"),
        format!("value {}", hex(b"\x00\xff\x00rust+"))
    );
    s.multi_set(&[("m1", b"1".as_slice()), ("m2", b"\x00".as_slice())])
        .unwrap();
    assert_eq!(srv.cmd("get m2"), "value 00");
    assert_eq!(
        s.multi_get(&["m1", "m2", "py_bin"], T).unwrap(),
        vec![b"1".to_vec(), b"\x00".to_vec(), b"\x00\xff\x01".to_vec()]
    );
    assert!(s.delete_key("m1").unwrap());
    assert!(!s.delete_key("m1").unwrap());
    assert_eq!(srv.cmd("check m1"), "false");
    assert_eq!(
        srv.cmd("num_keys"),
        format!("value {}", s.num_keys().unwrap())
    );
    let mut ours = s.list().unwrap();
    ours.sort();
    let theirs: Vec<String> = srv
        .cmd("list")
        .split_whitespace()
        .skip(1)
        .map(|h| {
            let bytes: Vec<u8> = (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect();
            String::from_utf8(bytes).unwrap()
        })
        .collect();
    assert_eq!(ours, theirs);
    assert!(ours.contains(&"py_bin".to_owned()) && ours.contains(&"rust_bin".to_owned()));

    // A WAIT (inside get) later satisfied by Python, and a multi-key wait.
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| s.get("late", T));
        let waiter2 = scope.spawn(|| {
            // Another connection, since one connection runs one request at a time.
            let s2 = TcpStore::connect("127.0.0.1", port, &opts()).unwrap();
            s2.wait(&["w1", "w2"], T)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(srv.cmd("set late 6c617465"), "ok");
        assert_eq!(srv.cmd("set w1 31"), "ok");
        assert_eq!(srv.cmd("set w2 32"), "ok");
        assert_eq!(waiter.join().unwrap().unwrap(), b"late");
        waiter2.join().unwrap().unwrap();
    });

    // Timeout: CANCEL_WAIT is accepted by torch's server and the stream stays in step.
    let start = Instant::now();
    let err = s.get("never", Duration::from_millis(300)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(err.status, Status::Timeout);
    assert!(
        err.message
            .starts_with("wait timeout after 300ms, keys: /never"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
    let err = s
        .multi_get(&["py_bin", "never"], Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    s.ping().unwrap();
    assert_eq!(s.get("py_bin", T).unwrap(), b"\x00\xff\x01");

    barrier_rounds_and_arrivals(port, &s);

    // Limits: 8 MiB goes through, 9 MiB is refused before sending.
    let big = vec![0xa5u8; wire::MAX_VALUE_LEN];
    s.set("big", &big).unwrap();
    assert_eq!(srv.cmd("len big"), format!("value {}", big.len()));
    assert_eq!(s.get("big", T).unwrap(), big);
    let err = s.set("huge", &vec![0u8; 9 << 20]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    s.ping().unwrap();

    if libuv {
        assert_eq!(srv.cmd("queue_push q 6669727374"), "ok");
        s.queue_push("q", b"\x00second").unwrap();
        assert_eq!(s.queue_len("q").unwrap(), 2);
        assert_eq!(s.queue_pop("q", None).unwrap(), Some(b"first".to_vec()));
        assert_eq!(
            s.queue_pop("q", Some(T)).unwrap(),
            Some(b"\x00second".to_vec())
        );
        assert_eq!(s.queue_pop("q", None).unwrap(), None);
        let err = s
            .queue_pop("q", Some(Duration::from_millis(100)))
            .unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        s.ping().unwrap();
    } else {
        // The classic server does not implement queues and closes the connection.
        let err = s.queue_len("q").unwrap_err();
        assert_eq!(err.status, Status::Io, "{err}");
        assert_eq!(s.ping().unwrap_err().status, Status::InvalidState);
        s.reconnect().unwrap();
        assert_eq!(s.get("py_bin", T).unwrap(), b"\x00\xff\x01");
    }

    assert_eq!(srv.cmd("quit"), "ok");
    srv.succeed();
    // The server is gone: a clear I/O error naming the store, not a hang.
    let start = Instant::now();
    let err = s.add("n", 1).unwrap_err();
    assert!(matches!(err.status, Status::Io), "{err}");
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
    assert!(start.elapsed() < T);
}

#[test]
fn pipelined_barriers_against_our_server() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let s = TcpStore::connect("127.0.0.1", server.port(), &opts()).unwrap();
    barrier_rounds_and_arrivals(server.port(), &s);
}

#[test]
fn our_client_against_torch_libuv_server() {
    our_client_against_torch_server(true);
}

#[test]
fn our_client_against_torch_classic_server() {
    our_client_against_torch_server(false);
}

/// A torch master with world_size=2 finishes its constructor only once our client has sent
/// ADD "init/" 1.
fn torch_master_waits_for_our_client(libuv: bool) {
    let Some(py) = python(&format!("torch_master_waits_for_our_client(libuv={libuv})")) else {
        return;
    };
    let mut srv = Py::spawn(
        &py,
        "torch_server.py",
        &[
            "--libuv",
            if libuv { "1" } else { "0" },
            "--world-size",
            "2",
        ],
    );
    let port: u16 = srv.expect("port ").trim().parse().unwrap();
    // A client that does not announce itself does not complete the rendezvous.
    let plain = TcpStore::connect("127.0.0.1", port, &opts()).unwrap();
    assert!(
        srv.silent_for(Duration::from_millis(700)),
        "master ready too early"
    );
    let worker = TcpStore::connect(
        "127.0.0.1",
        port,
        &ConnectOptions {
            wait_for_workers: Some(2),
            ..opts()
        },
    )
    .unwrap();
    srv.expect("ready");
    assert_eq!(srv.cmd("set hello 6869"), "ok");
    assert_eq!(worker.get("hello", T).unwrap(), b"hi");
    assert_eq!(plain.get("hello", T).unwrap(), b"hi");
    assert_eq!(srv.cmd("quit"), "ok");
    srv.succeed();
}

#[test]
fn torch_libuv_master_waits_for_our_client() {
    torch_master_waits_for_our_client(true);
}

#[test]
fn torch_classic_master_waits_for_our_client() {
    torch_master_waits_for_our_client(false);
}

#[test]
fn gloo_all_reduce_with_our_server_as_rendezvous() {
    let Some(py) = python("gloo_all_reduce_with_our_server_as_rendezvous") else {
        return;
    };
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port().to_string();
    let mut ranks: Vec<Py> = (0..2)
        .map(|r| Py::spawn(&py, "gloo_rank.py", &[&r.to_string(), &port]))
        .collect();
    for (r, rank) in ranks.iter_mut().enumerate() {
        let line = rank.expect("OK rank ");
        assert_eq!(line, format!("{r} sum [3.0, 30.0]"));
        rank.succeed();
    }
    // Both ranks announced themselves (world_size=2 clients send ADD "init/" 1).
    assert_eq!(raw_get(server.port(), "init/"), b"2");
}
