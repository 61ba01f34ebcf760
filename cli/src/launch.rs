//! `nvfipc launch -n N -- CMD ARGS...`: hosts a store, runs N ranks of CMD on this machine,
//! prefixes their output with `[rank R] `, and stops everything when one rank fails.
//!
//! [`run_job`] is the same machinery for other commands (`demo`, `bench`), which may instead let
//! rank 0 host the store itself (as `torchrun` and `mpirun` jobs do, through `MASTER_PORT`).

use crate::args::{millis, world_size};
use crate::signals::Signals;
use nvfipc_store::server::StoreServer;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Variables that would override ours in the library's configuration (docs/CONFIGURATION.md)
/// when launch itself runs under MPI (or under another launcher).
const INHERITED_RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "NVFUSER_MASTER_ADDR",
    "NVFUSER_MASTER_PORT",
    "NVFIPC_STORE_ADDR",
];
const POLL: Duration = Duration::from_millis(10);
/// How long output readers may take to drain after the last rank exited (a rank's own children
/// can keep its pipes open).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
const STORE_HOST: &str = "127.0.0.1";
/// Tasks the launcher starts per rank: the rank's process and one thread for each of its output
/// pipes.
const TASKS_PER_RANK: u64 = 3;
/// Stack of a thread copying a rank's output (it needs little, and thousands may run).
const READER_STACK: usize = 128 * 1024;
/// Exit status for a mistake of the caller (what the README promises, as clap's own errors).
pub const USAGE_ERROR: i32 = 2;

/// N ranks of CMD on this machine, with a store and torchrun's variables
///
/// Hosts a store on 127.0.0.1 and runs N ranks of CMD; each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
/// NVFIPC_STORE_ADDR, WORLD_RANK, WORLD_LOCAL_RANK, WORLD_LOCAL_SIZE and NVFIPC_LAUNCH_ID (this
/// launch's job id). CMD `nvfipc` runs this
/// nvfipc program. Every output line is prefixed with "[rank R] ". When a rank fails, the others
/// get SIGTERM, then SIGKILL after the grace period, and nvfipc exits with the failed rank's
/// status (128 + signal number for a signal).
#[derive(clap::Args, Debug, PartialEq, Eq)]
#[command(override_usage = "nvfipc launch -n N [--port P] [--kill-grace-ms MS] [--] CMD [ARGS...]")]
pub struct LaunchArgs {
    /// Number of ranks
    // `-n` first, as the usage line and errors name it; `--nproc` (torchrun's word) also works.
    #[arg(short = 'n', visible_alias = "nproc", value_name = "N", value_parser = world_size)]
    pub ranks: usize,
    /// Port of the store (0 picks a free one)
    #[arg(long, value_name = "P", default_value_t = 0)]
    pub port: u16,
    /// Milliseconds between SIGTERM and SIGKILL when stopping the ranks
    #[arg(long = "kill-grace-ms", value_name = "MS", default_value = "5000", value_parser = millis)]
    pub grace: Duration,
    /// The command every rank runs, with its arguments (everything from CMD on is its own)
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// Who hosts the job's store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreHost {
    /// The launcher hosts it on `port` (0: a free one); ranks get `NVFIPC_STORE_ADDR`.
    Launcher { port: u16 },
    /// Rank 0 hosts it through `Context::from_env` on `port` (0: a free one, picked here);
    /// ranks get only `MASTER_ADDR`/`MASTER_PORT`.
    Rank0 { port: u16 },
}

/// A job of N ranks of one command on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub ranks: usize,
    pub command: Vec<String>,
    pub grace: Duration,
    pub store: StoreHost,
    /// Rank 0's standard output is copied without the `[rank 0] ` prefix (its report).
    pub plain_rank0_stdout: bool,
    /// Extra variables for every rank.
    pub env: Vec<(String, String)>,
}

/// The exit status a shell would report: the code, or 128 + the signal number.
fn shell_status(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Copies `source` to `sink` line by line, each line prefixed with `prefix`.
fn prefix_lines(source: impl Read, prefix: &str, sink: fn() -> Box<dyn Write>) {
    let mut reader = BufReader::new(source);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        let mut out = sink();
        // The launcher keeps running if its own output is closed.
        let _ = out
            .write_all(prefix.as_bytes())
            .and_then(|()| out.write_all(&line))
            .and_then(|()| out.flush());
    }
}

fn stdout_sink() -> Box<dyn Write> {
    Box::new(io::stdout().lock())
}

fn stderr_sink() -> Box<dyn Write> {
    Box::new(io::stderr().lock())
}

struct Rank {
    child: Child,
    done: Option<ExitStatus>,
}

/// Starts a thread copying one of a rank's pipes to ours, each line prefixed; it says on `tx`
/// when the pipe has closed.
fn spawn_reader(
    source: impl Read + Send + 'static,
    prefix: String,
    sink: fn() -> Box<dyn Write>,
    tx: mpsc::Sender<()>,
) -> io::Result<()> {
    thread::Builder::new()
        .name("nvfipc-output".into())
        .stack_size(READER_STACK)
        .spawn(move || {
            prefix_lines(source, &prefix, sink);
            let _ = tx.send(());
        })
        .map(drop)
}

/// Whether the machine can start `ranks` ranks (each a process and two threads); the message
/// when it cannot.
pub fn check_capacity(ranks: usize) -> Result<(), String> {
    let needed = (ranks as u64).saturating_mul(TASKS_PER_RANK);
    match task_headroom() {
        Some((room, why)) if needed > room => Err(format!(
            "{ranks} ranks need about {needed} processes and threads, more than this machine \
             lets this program start ({room} more: {why}); use fewer ranks"
        )),
        _ => Ok(()),
    }
}

/// How many more tasks (processes and threads) this process can start, as far as the system
/// says, and the limit that bounds it: the soft RLIMIT_NPROC of this user (not for root, whom the
/// kernel exempts; the user's tasks that already run are not counted), and the tasks left under
/// `kernel.threads-max` and `kernel.pid_max`, and the tasks left under this process's cgroup
/// `pids.max` (a container's usual limit). `None` when nothing bounds it.
fn task_headroom() -> Option<(u64, String)> {
    let mut bounds: Vec<(u64, String)> = Vec::new();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass; geteuid takes no arguments.
    let (nproc, root) = unsafe {
        (
            libc::getrlimit(libc::RLIMIT_NPROC, &mut lim) == 0,
            libc::geteuid() == 0,
        )
    };
    if nproc && !root && lim.rlim_cur != libc::RLIM_INFINITY {
        bounds.push((
            lim.rlim_cur,
            format!(
                "the process limit of this user (ulimit -u {})",
                lim.rlim_cur
            ),
        ));
    }
    let read_number =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    // The fourth field of /proc/loadavg is "running/total" tasks of the system.
    let tasks_now = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| {
        s.split_whitespace()
            .nth(3)?
            .split('/')
            .nth(1)?
            .parse::<u64>()
            .ok()
    });
    if let Some(now) = tasks_now {
        for (path, name) in [
            ("/proc/sys/kernel/threads-max", "kernel.threads-max"),
            ("/proc/sys/kernel/pid_max", "kernel.pid_max"),
        ] {
            if let Some(max) = read_number(path) {
                bounds.push((
                    max.saturating_sub(now),
                    format!("{name} = {max} with {now} tasks running"),
                ));
            }
        }
    }
    // Tasks left under the cgroup's `pids` controller, when it sets a limit.
    let pids = || -> Option<(u64, String)> {
        let dir = nvfuser_ipc::tools::os::cgroup_dir("pids")?;
        let max: u64 = read_number(&format!("{dir}/pids.max"))?;
        let current: u64 = read_number(&format!("{dir}/pids.current"))?;
        Some((
            max.saturating_sub(current),
            format!("the cgroup's pids.max = {max} with {current} tasks in it"),
        ))
    };
    bounds.extend(pids());
    bounds.into_iter().min_by_key(|(n, _)| *n)
}

/// Whether an error starting a rank means the machine ran out of processes, threads or memory.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM))
        || e.kind() == io::ErrorKind::OutOfMemory
}

/// Sends `signal` to the process group of every rank that has not been reaped yet (a reaped
/// rank's group id may already belong to someone else).
fn signal_running(ranks: &[Rank], signal: libc::c_int) {
    for rank in ranks.iter().filter(|r| r.done.is_none()) {
        let pgid = rank.child.id() as libc::pid_t;
        // SAFETY: kill(2) takes no pointers. The child is unreaped, so its pid (= group id,
        // set with process_group(0)) still names that group.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// The program to run for CMD: `nvfipc` is this program (so `nvfipc launch -n 4 -- nvfipc
/// barrier-test` works without nvfipc on PATH); anything else is looked up as usual.
fn program(command: &str) -> std::ffi::OsString {
    if command == "nvfipc" {
        if let Ok(exe) = std::env::current_exe() {
            return exe.into_os_string();
        }
    }
    command.into()
}

/// This launcher's job id, exported to every rank as `NVFIPC_LAUNCH_ID`: the library names the
/// job's runs on a store with it, so two launches whose ranks share one store never mix. Random
/// (the OS-seeded hasher, with the pid and the time mixed in); one per launcher process, which
/// runs one job.
static LAUNCH_ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    format!("launch-{:016x}", hasher.finish())
});

fn spawn_rank(spec: &JobSpec, rank: usize, port: u16) -> io::Result<Child> {
    let mut cmd = Command::new(program(&spec.command[0]));
    let (r, n) = (rank.to_string(), spec.ranks.to_string());
    for var in INHERITED_RANK_VARS {
        cmd.env_remove(var);
    }
    cmd.env(nvfuser_ipc::tools::config::LAUNCH_ID_VAR, &*LAUNCH_ID);
    if let StoreHost::Launcher { .. } = spec.store {
        cmd.env("NVFIPC_STORE_ADDR", format!("{STORE_HOST}:{port}"));
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.args(&spec.command[1..])
        .env("RANK", &r)
        .env("WORLD_SIZE", &n)
        .env("LOCAL_RANK", &r)
        .env("LOCAL_WORLD_SIZE", &n)
        .env("WORLD_RANK", &r)
        .env("WORLD_LOCAL_RANK", &r)
        .env("WORLD_LOCAL_SIZE", &n)
        .env("MASTER_ADDR", STORE_HOST)
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that stopping a rank also stops what it started.
        .process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            // Ranks die with the launcher even if it is killed with SIGKILL.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Runs the `launch` command; returns the exit status for the launcher.
pub fn run(args: &LaunchArgs) -> i32 {
    run_job(&JobSpec {
        ranks: args.ranks,
        command: args.command.clone(),
        grace: args.grace,
        store: StoreHost::Launcher { port: args.port },
        plain_rank0_stdout: false,
        env: Vec::new(),
    })
}

/// A port that was free a moment ago, for a store that a rank will host.
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind((STORE_HOST, 0))?
        .local_addr()?
        .port())
}

/// Runs a job to its end; returns the exit status (0, or the first failed rank's).
pub fn run_job(spec: &JobSpec) -> i32 {
    let signals = match Signals::install(&[libc::SIGINT, libc::SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nvfipc launch: cannot install signal handlers: {e}");
            return 1;
        }
    };
    if let Err(message) = check_capacity(spec.ranks) {
        eprintln!("nvfipc launch: {message}");
        return USAGE_ERROR;
    }
    // The store server's lines go through the library's log, as the ranks' do.
    nvfuser_ipc::tools::logging::init();
    let (server, port) = match spec.store {
        StoreHost::Launcher { port } => match StoreServer::bind(STORE_HOST, port) {
            Ok(server) => {
                let port = server.port();
                (Some(server), port)
            }
            Err(e) => {
                eprintln!("nvfipc launch: cannot host the store: {e}");
                return 1;
            }
        },
        StoreHost::Rank0 { port: 0 } => match free_port() {
            Ok(port) => (None, port),
            Err(e) => {
                eprintln!("nvfipc launch: cannot find a free port for the store: {e}");
                return 1;
            }
        },
        StoreHost::Rank0 { port } => (None, port),
    };

    let (drained_tx, drained_rx) = mpsc::channel::<()>();
    let mut readers = 0;
    let mut ranks: Vec<Rank> = Vec::with_capacity(spec.ranks);
    let mut verdict: Option<i32> = None;
    for r in 0..spec.ranks {
        // A signal while starting the ranks stops the start: those already running are
        // stopped below.
        if let Some(signal) = signals.take() {
            eprintln!(
                "nvfipc launch: got signal {signal} while starting rank {r} of {}; stopping the \
                 ranks started so far",
                spec.ranks
            );
            verdict = Some(128 + signal);
            break;
        }
        let mut child = match spawn_rank(spec, r, port) {
            Ok(child) => child,
            Err(e) => {
                let resources = out_of_resources(&e);
                eprintln!(
                    "nvfipc launch: cannot start rank {r} of {} ({}): {e}{}; stopping the ranks \
                     started so far",
                    spec.ranks,
                    spec.command[0],
                    if resources {
                        " (out of processes or memory: see `ulimit -u`)"
                    } else {
                        ""
                    }
                );
                // Like a shell: 127 when the command does not exist, 126 when it cannot run.
                verdict = Some(match e.kind() {
                    _ if resources => 1,
                    io::ErrorKind::NotFound => 127,
                    _ => 126,
                });
                break;
            }
        };
        let prefix = format!("[rank {r}] ");
        let mut started = Ok(());
        if let Some(out) = child.stdout.take() {
            let plain = r == 0 && spec.plain_rank0_stdout;
            let p = if plain { String::new() } else { prefix.clone() };
            started = spawn_reader(out, p, stdout_sink, drained_tx.clone());
            readers += usize::from(started.is_ok());
        }
        if let (Ok(()), Some(err)) = (&started, child.stderr.take()) {
            started = spawn_reader(err, prefix, stderr_sink, drained_tx.clone());
            readers += usize::from(started.is_ok());
        }
        // The rank counts as started either way, so that it is stopped and reaped with the rest.
        ranks.push(Rank { child, done: None });
        if let Err(e) = started {
            eprintln!(
                "nvfipc launch: cannot start a thread for the output of rank {r} of {}: {e} (out \
                 of threads or memory: see `ulimit -u`); stopping the ranks started so far",
                spec.ranks
            );
            verdict = Some(1);
            break;
        }
    }
    drop(drained_tx);

    let mut kill_at: Option<Instant> = if verdict.is_some() {
        signal_running(&ranks, libc::SIGTERM);
        Some(Instant::now() + spec.grace)
    } else {
        None
    };
    let mut killed = false;
    loop {
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.done.is_some() {
                continue;
            }
            match rank.child.try_wait() {
                Ok(Some(status)) => {
                    rank.done = Some(status);
                    if !status.success() && verdict.is_none() {
                        eprintln!(
                            "nvfipc launch: rank {r} failed ({status}); stopping the other ranks"
                        );
                        verdict = Some(shell_status(status));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("nvfipc launch: cannot wait for rank {r}: {e}");
                    verdict.get_or_insert(1);
                }
            }
        }
        if ranks.iter().all(|r| r.done.is_some()) {
            break;
        }
        if verdict.is_some() && kill_at.is_none() {
            signal_running(&ranks, libc::SIGTERM);
            kill_at = Some(Instant::now() + spec.grace);
        }
        if let Some(at) = kill_at {
            if !killed && Instant::now() >= at {
                signal_running(&ranks, libc::SIGKILL);
                killed = true;
            }
        }
        match signals.wait(Some(POLL)) {
            Ok(Some(signal)) => {
                if verdict.is_none() {
                    eprintln!("nvfipc launch: got signal {signal}; stopping the ranks");
                    verdict = Some(128 + signal);
                } else if kill_at.is_some() {
                    // A second interrupt: stop waiting politely.
                    kill_at = Some(Instant::now());
                }
            }
            Ok(None) => {}
            Err(_) => thread::sleep(POLL),
        }
    }

    let deadline = Instant::now() + DRAIN_LIMIT;
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if drained_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    if let Some(server) = server {
        server.shutdown();
    }
    verdict.unwrap_or(0)
}

#[cfg(test)]
mod tests;
