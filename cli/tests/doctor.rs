//! `nvfipc doctor` as users run it: its text and JSON reports on this host, and a two-rank job
//! in which one rank runs in IPC, network and PID namespaces of its own (`ip netns` joined by a
//! veth pair where the machine permits, `unshare`), which both ranks must report.

use serde_json::Value;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../src/tests/ports.rs"]
mod ports;

const NVFIPC: &str = env!("CARGO_BIN_EXE_nvfipc");

/// Launcher variables a test's environment may carry; the doctor must not think it is a rank.
const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "WORLD_RANK",
    "WORLD_SIZE",
    "WORLD_LOCAL_RANK",
    "WORLD_LOCAL_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NVFUSER_MASTER_ADDR",
    "NVFUSER_MASTER_PORT",
    "NVFIPC_STORE_ADDR",
    "NVFIPC_JOB_TAG",
];

fn command(program: &str) -> Command {
    let mut c = Command::new(program);
    for var in LAUNCHER_VARS {
        c.env_remove(var);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn wait(child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for nvfipc doctor"),
        Err(_) => {
            // SAFETY: kill takes a pid and a signal by value; the pid is our child's.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!(
                "nvfipc doctor did not finish within {limit:?} ({:?})",
                start.elapsed()
            );
        }
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const VERDICTS: [&str; 4] = ["pass", "warn", "fail", "cannot check"];
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn text_report_names_every_gate_with_a_verdict() {
    let out = wait(command(NVFIPC).arg("doctor").spawn().unwrap(), LIMIT);
    let (stdout, stderr) = text(&out);
    assert!(stdout.starts_with("nvfipc doctor "), "{stdout}\n{stderr}");
    for gate in [
        "host: identity and namespaces: ",
        "host: /dev/shm: ",
        "host: open-file limit: ",
        "host: ptrace scope (Yama): ",
        "host: seccomp: ",
        "fd passing: fd responder: ",
        "fd passing: SCM_RIGHTS over the abstract socket: ",
        "fd passing: SCM_RIGHTS over the socket file: ",
        "fd passing: pidfd_getfd: ",
        "cuda: driver: ",
        "cuda: runtime: ",
        "cuda: peer access: ",
        "cuda: VMM with POSIX fds: ",
        "cuda: VMM with FABRIC handles: ",
        "cuda: multicast: ",
        "cuda: devices and compute mode: ",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(gate))
            .unwrap_or_else(|| panic!("no line for {gate:?}:\n{stdout}"));
        assert!(
            VERDICTS.iter().any(|v| line.starts_with(v)),
            "{line:?} starts with no verdict"
        );
    }
    // Not a job: no job lines.
    assert!(!stdout.contains(" job: "), "{stdout}");
    // Two processes of one user on this machine pass descriptors over the abstract socket.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("pass") && l.contains("SCM_RIGHTS over the abstract socket")),
        "{stdout}"
    );
    let failed = stdout.lines().any(|l| l.starts_with("fail "));
    assert_eq!(out.status.code(), Some(i32::from(failed)), "{stdout}");
    assert!(
        stdout.lines().last().unwrap().contains(" checks: "),
        "{stdout}"
    );
}

#[test]
fn json_report_is_one_object_with_counts_that_match() {
    let out = wait(
        command(NVFIPC).args(["doctor", "--json"]).spawn().unwrap(),
        LIMIT,
    );
    let (stdout, stderr) = text(&out);
    let v: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let checks = v["checks"].as_array().expect("a checks array");
    assert!(checks.len() >= 16, "{v}");
    for c in checks {
        for field in ["area", "name", "verdict", "detail", "fix"] {
            assert!(c[field].is_string(), "{field} of {c}");
        }
        assert!(VERDICTS.contains(&c["verdict"].as_str().unwrap()), "{c}");
    }
    let count = |verdict: &str| checks.iter().filter(|c| c["verdict"] == verdict).count();
    assert_eq!(v["summary"]["pass"], count("pass"));
    assert_eq!(v["summary"]["fail"], count("fail"));
    assert_eq!(v["summary"]["cannot_check"], count("cannot check"));
    assert_eq!(v["ok"], count("fail") == 0);
    assert_eq!(out.status.code(), Some(i32::from(count("fail") > 0)));
    assert!(v["rank"].is_null() && v["job"].is_null(), "{v}");
    // Without a GPU every device check says so instead of failing.
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        let driver = checks.iter().find(|c| c["name"] == "driver").unwrap();
        assert_eq!(driver["verdict"], "cannot check", "{driver}");
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace joined to this one by a veth pair: `<subnet>.1` here, `.2` there.
struct Netns {
    name: String,
}

impl Netns {
    fn create() -> Option<(Netns, String)> {
        let id = std::process::id();
        let name = format!("nvfipc-doc{id}");
        let (a, b) = (
            format!("nvd{}a", id % 100_000),
            format!("nvd{}b", id % 100_000),
        );
        let subnet = format!("10.{}.{}", 200 + (id % 50), (id / 50) % 250);
        let ns = Netns { name: name.clone() };
        let ok = ip(&["netns", "add", &name])
            && ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
            && ip(&["link", "set", &b, "netns", &name])
            && ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &a])
            && ip(&["link", "set", &a, "up"])
            && ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"])
            && ip(&[
                "netns",
                "exec",
                &name,
                "ip",
                "addr",
                "add",
                &format!("{subnet}.2/24"),
                "dev",
                &b,
            ])
            && ip(&["netns", "exec", &name, "ip", "link", "set", &b, "up"]);
        if !ok {
            let _ = ip(&["link", "del", &a]);
            return None;
        }
        Some((ns, format!("{subnet}.1")))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A port free on every address right now, below the ephemeral range, so that no connection of
/// another process on this machine takes it before rank 0 binds it (see `src/tests/ports.rs`).
fn free_port() -> u16 {
    ports::port_below_ephemeral(|port| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok())
}

/// Rank 1 runs in IPC, network and PID namespaces of its own (the network one joined to this
/// one by a veth pair, so that it reaches the store): both ranks name each difference, fail on
/// the IPC namespace (no memory can be mapped between them), and pass descriptors by the socket
/// file where the abstract socket cannot reach.
#[test]
fn a_rank_in_other_namespaces_is_reported_by_both() {
    let permitted = Command::new("unshare")
        .args(["--ipc", "--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !permitted {
        println!("SKIPPED: this machine forbids IPC/PID namespaces (unshare --ipc --pid)");
        return;
    }
    let net = Netns::create();
    let (addr, other_net) = match &net {
        Some((_, addr)) => (addr.clone(), true),
        None => {
            println!(
                "note: no network namespace with a veth pair here; rank 1 gets IPC and PID \
                 namespaces of its own only"
            );
            ("127.0.0.1".to_string(), false)
        }
    };
    let port = free_port().to_string();
    let tag = format!("doctor-ns-{}", std::process::id());
    let spawn = |rank: usize| {
        let mut c = match (rank, &net) {
            (0, _) => command(NVFIPC),
            (_, Some((ns, _))) => {
                let mut c = command("ip");
                c.args([
                    "netns", "exec", &ns.name, "unshare", "--ipc", "--pid", "--fork",
                ])
                .arg(NVFIPC);
                c
            }
            (_, None) => {
                let mut c = command("unshare");
                c.args(["--ipc", "--pid", "--fork"]).arg(NVFIPC);
                c
            }
        };
        c.args(["doctor", "--timeout-ms", "20000"])
            .env("WORLD_RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("WORLD_LOCAL_RANK", rank.to_string())
            .env("WORLD_LOCAL_SIZE", "2")
            .env("MASTER_ADDR", &addr)
            .env("MASTER_PORT", &port)
            .env("NVFIPC_JOB_TAG", &tag)
            .spawn()
            .expect("spawn a rank")
    };
    let ranks = [spawn(0), spawn(1)];
    let outs: Vec<Output> = ranks.into_iter().map(|c| wait(c, LIMIT)).collect();
    for (rank, out) in outs.iter().enumerate() {
        let (stdout, stderr) = text(out);
        let peer = 1 - rank;
        let all = format!("rank {rank}:\n{stdout}\n{stderr}");
        assert!(stdout.contains(&format!("rank {rank} of 2")), "{all}");
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!(" job: rank {peer}: ")))
            .unwrap_or_else(|| panic!("no line about rank {peer}: {all}"));
        assert!(line.starts_with("fail "), "{line}");
        assert!(line.contains("IPC namespace"), "{line}");
        assert!(line.contains("PID namespace"), "{line}");
        if other_net {
            assert!(line.contains("network namespace"), "{line}");
            // The abstract socket cannot reach the other namespace; the socket file can.
            assert!(
                stdout.lines().any(|l| l.starts_with("warn ")
                    && l.contains("job: SCM_RIGHTS over the abstract socket")),
                "{all}"
            );
            assert!(
                stdout.lines().any(|l| l.starts_with("pass ")
                    && l.contains("job: SCM_RIGHTS over the socket file")),
                "{all}"
            );
        }
        assert_eq!(out.status.code(), Some(1), "{all}");
    }
}
