//! Store server benchmark: our server (`nvfipc serve`, its own process) against PyTorch's
//! TCPStore server (libuv and classic backends, one Python process hosting both), driven by the
//! same load generator: N client threads, each with its own connection (our `TcpStore`), each
//! alternating SET and GET on its own keys for a fixed time.
//!
//! Throughput counts every operation; latency is measured on GETs (a SET has no reply in this
//! protocol, so its time is only the send).

use super::report::{LoadResult, Results};
use super::{BenchArgs, Plan};
use crate::stats::{nanos, quantile};
use nvfipc_store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::{Error, Result};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Variable naming the Python (with torch) that hosts PyTorch's servers.
pub const PYTHON_VAR: &str = "NVFIPC_PYTHON";
const START_LIMIT: Duration = Duration::from_secs(60);
const VALUE: [u8; 64] = [0x5a; 64];
const KEYS_PER_CLIENT: usize = 16;

/// Hosts one TCPStore server per backend and prints "<backend> <port>" for each, then serves
/// until its standard input closes.
const TORCH_SERVERS: &str = r#"
import datetime, sys, warnings
warnings.filterwarnings("ignore")
from torch.distributed import TCPStore
stores = []
for name, libuv in (("libuv", True), ("classic", False)):
    try:
        s = TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=300),
                     wait_for_workers=False, use_libuv=libuv)
        stores.append(s)
        print(name, s.port, flush=True)
    except Exception as e:
        print(name, "unavailable:", str(e).replace("\n", " "), flush=True)
print("ready", flush=True)
sys.stdin.read()
"#;

/// One server under test: its label, port, and the process hosting it.
pub struct Server {
    pub label: String,
    pub port: u16,
}

/// A child process that is killed and reaped on drop.
pub struct Hosted {
    child: Child,
}

impl Drop for Hosted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads lines from `out` until `done(line)` says stop, bounded by [`START_LIMIT`].
fn read_lines_until(out: ChildStdout, mut done: impl FnMut(&str) -> bool) -> Result<()> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if done(&line) => return Ok(()),
            Ok(_) => {}
            Err(_) => {
                return Err(Error::timeout(format!(
                    "the server process did not report its port within {START_LIMIT:?}"
                )))
            }
        }
    }
}

/// Settings of our server other than its defaults; they show in its label.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct OurServer {
    /// --busy-poll-us of our server, as for serve (its label then names it)
    #[arg(long, value_name = "US")]
    pub busy_poll_us: Option<u64>,
    /// --threads of our server, as for serve (its label then names it)
    #[arg(long = "server-threads", value_name = "N")]
    pub threads: Option<usize>,
}

impl OurServer {
    fn label(&self) -> String {
        let mut label = String::from("nvfipc");
        if let Some(t) = self.threads {
            label.push_str(&format!("-{t}t"));
        }
        if let Some(us) = self.busy_poll_us {
            label.push_str(&format!("-poll{us}us"));
        }
        label
    }
}

/// Starts `nvfipc serve` on a free loopback port with `settings`.
pub fn start_ours(exe: &str, settings: &OurServer) -> Result<(Hosted, Server)> {
    let mut args: Vec<String> = ["serve", "--host", "127.0.0.1", "--port", "0"]
        .map(String::from)
        .to_vec();
    if let Some(us) = settings.busy_poll_us {
        args.extend(["--busy-poll-us".into(), us.to_string()]);
    }
    if let Some(t) = settings.threads {
        args.extend(["--threads".into(), t.to_string()]);
    }
    let mut child = Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::from_io(format!("starting {exe} serve"), &e))?;
    let out = child.stdout.take().expect("stdout is piped");
    let hosted = Hosted { child };
    let mut port = None;
    read_lines_until(out, |line| {
        port = line
            .strip_prefix("listening on ")
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok());
        port.is_some()
    })?;
    let port = port.expect("read_lines_until only returns Ok once a port was read");
    Ok((
        hosted,
        Server {
            label: settings.label(),
            port,
        },
    ))
}

/// Starts PyTorch's servers with `python`; returns them and notes on what is unavailable.
pub fn start_torch(python: &str) -> Result<(Hosted, Vec<Server>, Vec<String>)> {
    let mut child = Command::new(python)
        .args(["-W", "ignore", "-c", TORCH_SERVERS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::from_io(format!("starting {python}"), &e))?;
    let out = child.stdout.take().expect("stdout is piped");
    let hosted = Hosted { child };
    let (mut servers, mut notes) = (Vec::new(), Vec::new());
    read_lines_until(out, |line| {
        let mut words = line.splitn(2, ' ');
        let (name, rest) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        match rest.parse::<u16>() {
            Ok(port) => servers.push(Server {
                label: format!("torch-{name}"),
                port,
            }),
            Err(_) if name == "ready" => return true,
            Err(_) => notes.push(format!("torch {name} backend: {rest}")),
        }
        false
    })?;
    if servers.is_empty() {
        notes.push("torch started no server".into());
    }
    Ok((hosted, servers, notes))
}

/// Runs `clients` client threads against `port` for `duration`.
pub fn drive(port: u16, clients: usize, duration: Duration, run_id: &str) -> Result<LoadResult> {
    let connect = ConnectOptions {
        timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        wait_for_workers: None,
    };
    let stores = (0..clients)
        .map(|c| {
            TcpStore::connect("127.0.0.1", port, &connect)
                .map_err(|e| Error::from(e).context(format!("load client {c} of {clients}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let start_line = Arc::new(Barrier::new(clients + 1));
    let workers: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(c, store)| {
            let start_line = start_line.clone();
            let keys: Vec<String> = (0..KEYS_PER_CLIENT)
                .map(|k| format!("load/{run_id}/{clients}/{c}/{k}"))
                .collect();
            std::thread::spawn(move || -> Result<(u64, Vec<u64>)> {
                start_line.wait();
                let deadline = Instant::now() + duration;
                let (mut ops, mut gets) = (0u64, Vec::new());
                let mut i = 0;
                while Instant::now() < deadline {
                    let key = &keys[i % KEYS_PER_CLIENT];
                    store.set(key, &VALUE)?;
                    let start = Instant::now();
                    let value = store.get(key, Duration::from_secs(30))?;
                    gets.push(nanos(start.elapsed()));
                    if value.len() != VALUE.len() {
                        return Err(Error::protocol(format!(
                            "GET {key} returned {} bytes, expected {}",
                            value.len(),
                            VALUE.len()
                        )));
                    }
                    ops += 2;
                    i += 1;
                }
                Ok((ops, gets))
            })
        })
        .collect();
    start_line.wait();
    let start = Instant::now();
    let (mut ops, mut gets, mut failure) = (0, Vec::new(), None);
    for w in workers {
        match w.join() {
            Ok(Ok((n, g))) => {
                ops += n;
                gets.extend(g);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(Error::internal("a load client thread panicked")),
        }
    }
    let elapsed = start.elapsed();
    if let Some(e) = failure {
        return Err(e.context(format!("{clients} clients on port {port}")));
    }
    Ok(LoadResult {
        clients,
        ops,
        elapsed,
        get_p50_ns: quantile(&gets, 0.5),
        get_p90_ns: quantile(&gets, 0.9),
        round_rates: Vec::new(),
    })
}

/// The store scenario: our server and, when a Python with torch is at hand, PyTorch's, each
/// driven with every client count of the plan in interleaved rounds; the median round is kept.
pub fn run(args: &BenchArgs, plan: &Plan, exe: &str, results: &mut Results) {
    results.store_duration = plan.store_duration;
    let mut servers = Vec::new();
    let mut hosts = Vec::new();
    match start_ours(exe, &args.server) {
        Ok((host, server)) => {
            hosts.push(host);
            servers.push(server);
        }
        Err(e) => results.fail(format!("store: starting our server: {e}")),
    }
    let python = std::env::var(PYTHON_VAR).ok().filter(|p| !p.is_empty());
    match (args.no_torch, python) {
        (true, _) => results
            .store_notes
            .push("torch rows skipped (--no-torch)".into()),
        (false, None) => results.store_notes.push(format!(
            "torch rows skipped: {} is not set (NVFIPC_PYTHON=$(bash scripts/lib/python-env.sh) \
             gives a Python with torch)",
            PYTHON_VAR
        )),
        (false, Some(python)) => {
            eprintln!("nvfipc bench: starting PyTorch's TCPStore servers with {python}");
            match start_torch(&python) {
                Ok((host, torch, notes)) => {
                    hosts.push(host);
                    servers.extend(torch);
                    results.store_notes.extend(notes);
                }
                Err(e) => results.store_notes.push(format!(
                    "torch rows skipped: {python} could not host a TCPStore: {e}"
                )),
            }
        }
    }
    results.store_rounds = plan.store_rounds;
    for &clients in &plan.store_clients {
        // Rounds interleave the servers so that a slow spell of the machine hits them alike.
        let mut rounds: Vec<Vec<LoadResult>> = vec![Vec::new(); servers.len()];
        let mut failed = vec![false; servers.len()];
        for round in 0..plan.store_rounds {
            for (i, server) in servers.iter().enumerate() {
                if failed[i] {
                    continue;
                }
                eprintln!(
                    "nvfipc bench: store, {} server, {clients} clients, round {} of {}",
                    server.label,
                    round + 1,
                    plan.store_rounds
                );
                let run_id = format!("{i}.{round}");
                match drive(server.port, clients, plan.store_duration, &run_id) {
                    Ok(r) => rounds[i].push(r),
                    Err(e) => {
                        failed[i] = true;
                        results.fail(format!(
                            "store, {} server, {clients} clients: {e}",
                            server.label
                        ))
                    }
                }
            }
        }
        for (server, measured) in servers.iter().zip(rounds) {
            if let Some(median) = LoadResult::median_of(measured) {
                results.store.push((server.label.clone(), median));
            }
        }
    }
    drop(hosts);
}

#[cfg(test)]
mod tests;
