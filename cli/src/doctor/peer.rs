//! Descriptor passing probed between two processes of this host: this process exports a memfd
//! through the fd transport's responder, and a child process (`nvfipc doctor-peer`, a
//! descendant, which Yama `ptrace_scope=1` treats like a sibling rank when it attaches to its
//! parent) fetches it by each rung alone: SCM_RIGHTS over the abstract socket, SCM_RIGHTS over
//! the socket file, and `pidfd_getfd`, and reads the marker back. The job checks use the same
//! fetch between ranks.

use super::{Check, Verdict};
use crate::args::positive_ms;
use nvfipc_store::client::{ConnectOptions, TcpStore};
use nvfipc_store::server::StoreServer;
use nvfuser_ipc::store::Store;
use nvfuser_ipc::tools::fdpass::{FdId, FdPass, FdPassConfig, PeerRecord, Rung};
use nvfuser_ipc::tools::os::memfd;
use serde_json::{json, Value};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rungs probed, in the transport's default order.
pub const RUNGS: [Rung; 3] = [Rung::Abstract, Rung::Path, Rung::Pidfd];

/// The importing half of the local fd probe, started by `nvfipc doctor`; not for direct use.
#[derive(clap::Args, Debug, PartialEq, Eq)]
pub struct PeerArgs {
    /// The probe's store, HOST:PORT
    #[arg(long)]
    pub store: String,
    /// The probe's job name
    #[arg(long)]
    pub job: String,
    #[arg(long = "timeout-ms", value_name = "MS", value_parser = positive_ms)]
    pub timeout: Duration,
}

fn prefix(job: &str) -> String {
    format!("nvfipc-doctor/{job}")
}

/// A memfd holding `marker`, for a peer to fetch and read back.
pub fn marked_memfd(marker: &str) -> Result<std::os::fd::OwnedFd, String> {
    let fd = memfd::create("nvfipc-doctor").map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = File::from(fd);
    file.write_all(marker.as_bytes())
        .map_err(|e| format!("writing the memfd: {e}"))?;
    Ok(file.into())
}

/// Where the probe's fd transports meet: a store, a key prefix and a job name.
pub struct Meeting<'a> {
    pub store: &'a Arc<dyn Store>,
    pub prefix: &'a str,
    pub job: &'a str,
}

/// Fetches `id` of `peer` (as `rank`) by `rung` alone and checks that the descriptor holds
/// `marker`.
pub fn fetch_by(
    at: &Meeting<'_>,
    (rank, peer): (usize, usize),
    id: &FdId,
    rung: Rung,
    marker: &str,
    timeout: Duration,
) -> Result<(), String> {
    let mut config = FdPassConfig::from_env().map_err(|e| e.message)?;
    config.rungs = vec![rung];
    let fp = FdPass::new(at.store.clone(), at.prefix, at.job, rank, config);
    let fetched = fp
        .fetch_diagnosed(peer, std::slice::from_ref(id), timeout)
        .map_err(|f| f.into_error().message)?;
    let fd = fetched.fds.into_iter().next().ok_or("no descriptor came")?;
    let mut buf = vec![0u8; marker.len()];
    File::from(fd)
        .read_exact_at(&mut buf, 0)
        .map_err(|e| format!("the descriptor came but reading it failed: {e}"))?;
    if buf != marker.as_bytes() {
        return Err(format!(
            "the descriptor came but holds {:?}, not the exported file's {marker:?}",
            String::from_utf8_lossy(&buf)
        ));
    }
    Ok(())
}

/// `nvfipc doctor-peer`: fetch the parent's memfd by each rung and report through the store.
pub fn run_peer(args: &PeerArgs) -> i32 {
    let work = || -> Result<(), String> {
        let (host, port) = args
            .store
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("--store {:?} is not HOST:PORT", args.store))?;
        let options = ConnectOptions {
            timeout: args.timeout,
            connect_timeout: args.timeout,
            wait_for_workers: None,
        };
        let store: Arc<dyn Store> =
            Arc::new(TcpStore::connect(host, port, &options).map_err(|e| e.message)?);
        let prefix = prefix(&args.job);
        let id = store
            .get(&format!("{prefix}/id"), args.timeout)
            .map_err(|e| e.message)?;
        let id = FdId::decode(&id).ok_or("the exporter's fd id does not parse")?;
        let marker = store
            .get(&format!("{prefix}/marker"), args.timeout)
            .map_err(|e| e.message)?;
        let marker = String::from_utf8_lossy(&marker).into_owned();
        let per_rung = args.timeout.min(Duration::from_secs(5));
        let at = Meeting {
            store: &store,
            prefix: &prefix,
            job: &args.job,
        };
        let results: Vec<Value> = RUNGS
            .iter()
            .map(|&rung| {
                let r = fetch_by(&at, (1, 0), &id, rung, &marker, per_rung);
                json!({"rung": rung.name(), "ok": r.is_ok(), "error": r.err()})
            })
            .collect();
        store
            .set(
                &format!("{prefix}/result"),
                json!(results).to_string().as_bytes(),
            )
            .map_err(|e| e.message)
    };
    match work() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("nvfipc doctor-peer: {e}");
            1
        }
    }
}

/// The fd transport's checks: the responder, and each rung between two processes.
pub fn probe(timeout: Duration) -> Vec<Check> {
    match run_probe(timeout) {
        Ok(checks) => checks,
        Err(e) => vec![
            Check::new("fd passing", "probe between two processes", Verdict::Fail)
                .detail(e)
                .fix("see the message: the fd transport cannot start here"),
        ],
    }
}

fn run_probe(timeout: Duration) -> Result<Vec<Check>, String> {
    let config = FdPassConfig::from_env().map_err(|e| e.message)?;
    let server = StoreServer::bind("127.0.0.1", 0).map_err(|e| e.message)?;
    let options = ConnectOptions {
        timeout,
        connect_timeout: timeout,
        wait_for_workers: None,
    };
    let store: Arc<dyn Store> =
        Arc::new(TcpStore::connect("127.0.0.1", server.port(), &options).map_err(|e| e.message)?);
    let job = format!("doctor{}", std::process::id());
    let prefix = prefix(&job);
    let fp = FdPass::new(store.clone(), &prefix, &job, 0, config);
    let record = fp.start().map_err(|e| e.message)?;
    let marker = format!("nvfipc doctor probe of pid {}", std::process::id());
    let id = fp.register(marked_memfd(&marker)?).map_err(|e| e.message)?;
    store
        .set(&format!("{prefix}/marker"), marker.as_bytes())
        .map_err(|e| e.message)?;
    store
        .set(&format!("{prefix}/id"), &id.encode())
        .map_err(|e| e.message)?;
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let mut child = Command::new(exe)
        .args(["doctor-peer", "--store"])
        .arg(format!("127.0.0.1:{}", server.port()))
        .args(["--job", &job, "--timeout-ms"])
        .arg(timeout.as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the probe's second process: {e}"))?;
    let result = store.get(&format!("{prefix}/result"), timeout);
    let deadline = Instant::now() + Duration::from_secs(2);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let result = result.map_err(|e| {
        format!(
            "the probe's second process reported nothing ({}): {}",
            e.message,
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    let results: Vec<Value> =
        serde_json::from_slice(&result).map_err(|e| format!("the probe's report: {e}"))?;
    let outcome = |rung: Rung| -> Result<(), String> {
        let r = results
            .iter()
            .find(|r| r["rung"] == rung.name())
            .ok_or_else(|| format!("no result for {}", rung.name()))?;
        if r["ok"] == true {
            Ok(())
        } else {
            Err(r["error"].as_str().unwrap_or("failed").to_string())
        }
    };
    let outcomes: Vec<(Rung, Result<(), String>)> =
        RUNGS.iter().map(|&r| (r, outcome(r))).collect();
    Ok(rung_checks(&record, &outcomes, "a child process"))
}

/// One check for the responder and one per rung, from the outcomes of fetches by `who`.
pub fn rung_checks(
    record: &PeerRecord,
    outcomes: &[(Rung, Result<(), String>)],
    who: &str,
) -> Vec<Check> {
    let socket_ok = outcomes.iter().any(|(r, o)| *r != Rung::Pidfd && o.is_ok());
    let any_ok = outcomes.iter().any(|(_, o)| o.is_ok());
    let mut checks = vec![match &record.path {
        Ok(path) => Check::new("fd passing", "fd responder", Verdict::Pass).detail(format!(
            "listening on the abstract socket @{} and the socket file {}",
            record.abstract_name,
            path.display()
        )),
        Err(why) => Check::new("fd passing", "fd responder", Verdict::Warn)
            .detail(format!(
                "listening on the abstract socket @{} only: {why}",
                record.abstract_name
            ))
            .fix(
                "set NVFIPC_SOCKET_DIR to a directory this user may write (ranks in other \
                 network namespaces need the socket file)",
            ),
    }];
    for (rung, outcome) in outcomes {
        let name = match rung {
            Rung::Abstract => "SCM_RIGHTS over the abstract socket",
            Rung::Path => "SCM_RIGHTS over the socket file",
            _ => "pidfd_getfd",
        };
        checks.push(match outcome {
            Ok(()) => Check::new("fd passing", name, Verdict::Pass)
                .detail(format!("{who} fetched a memfd this way and read it back")),
            Err(e) => {
                let (verdict, fix) = if !any_ok {
                    (
                        Verdict::Fail,
                        "no way to pass a descriptor works: host buffers and VMM memory \
                         (expandable segments) cannot be shared; see each rung's gate",
                    )
                } else if *rung == Rung::Pidfd && socket_ok {
                    (
                        Verdict::Warn,
                        "nothing: the socket rungs, tried first, work (pidfd_getfd needs ptrace \
                         rights: CAP_SYS_PTRACE, Yama ptrace_scope=0 or NVFIPC_FD_PTRACER=any)",
                    )
                } else {
                    (
                        Verdict::Warn,
                        "nothing: another rung works (NVFIPC_FD_RUNGS sets the order)",
                    )
                };
                Check::new("fd passing", name, verdict)
                    .detail(format!("{who} could not fetch a memfd this way: {e}"))
                    .fix(fix)
            }
        });
    }
    checks
}
