//! Two 2-rank jobs started together on one long-lived store, round after round, without
//! `NVFIPC_JOB_TAG`: with a launcher's job id they never mix; without one, a job whose ranks were
//! paired with the other job's has a rank that fails with the named collision error (so neither
//! job completes on wrong partners). Every rank is a real process: this test binary re-run as
//! [`rank_process`], or the same started by `nvfipc launch`.

use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::{Context, EnvOptions};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const NVFIPC: &str = env!("CARGO_BIN_EXE_nvfipc");
const ROLE_VAR: &str = "NVFIPC_JOBS_TEST_ROLE";
/// Per rank, how long the rank sleeps before it creates its context (`ms0,ms1`).
const DELAYS_VAR: &str = "NVFIPC_JOBS_TEST_DELAYS";
/// Store and barrier timeout of the rank processes: a rank whose mate was refused gives up
/// after it.
const RANK_TIMEOUT: Duration = Duration::from_secs(8);
const BARRIERS: usize = 20;
/// What a refused rank's error says (the duplicate claim and the collision errors both do).
const NAMED: &str = "without distinct job tags";

/// Launcher variables (and tags) a rank process must not inherit from whoever runs the tests.
const CLEARED: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "NVFUSER_MASTER_ADDR",
    "NVFUSER_MASTER_PORT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NVFIPC_STORE_ADDR",
    "NVFIPC_TIMEOUT_MS",
    "NVFIPC_JOB_TAG",
    "NVFIPC_LAUNCH_ID",
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_hnp_uri",
    "OMPI_MCA_ess_base_jobid",
];

/// One rank: waits its delay, joins the job, passes the barriers, closes; prints `JOB <id>` or
/// `ERROR <message>`.
#[test]
#[ignore = "a rank process, started by the tests of this file"]
fn rank_process() {
    assert_eq!(std::env::var(ROLE_VAR).as_deref(), Ok("rank"));
    let rank: usize = std::env::var("WORLD_RANK").unwrap().parse().unwrap();
    let delays = std::env::var(DELAYS_VAR).unwrap_or_default();
    let delay: u64 = delays
        .split(',')
        .nth(rank)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    thread::sleep(Duration::from_millis(delay));
    let options = EnvOptions {
        timeout: Some(RANK_TIMEOUT),
        ..EnvOptions::default()
    };
    let run = || -> nvfuser_ipc::Result<String> {
        let ctx = Context::from_env(&options)?;
        for _ in 0..BARRIERS {
            ctx.barrier(None, None)?;
        }
        let id = ctx.job_id.clone();
        ctx.close()?;
        Ok(id)
    };
    match run() {
        Ok(id) => println!("\nJOB {id}"),
        Err(e) => {
            println!("\nERROR {e}");
            std::process::exit(1);
        }
    }
}

/// How one rank ended.
#[derive(Debug)]
enum Outcome {
    Joined(String),
    Failed(String),
}

impl Outcome {
    fn from_output(out: &Output) -> Outcome {
        let stdout = String::from_utf8_lossy(&out.stdout);
        for line in stdout.lines() {
            let line = line.split_once("] ").map_or(line, |(_, rest)| rest);
            if let Some(id) = line.strip_prefix("JOB ") {
                if out.status.success() {
                    return Outcome::Joined(id.to_string());
                }
            }
            if let Some(e) = line.strip_prefix("ERROR ") {
                return Outcome::Failed(e.to_string());
            }
        }
        Outcome::Failed(format!(
            "no outcome ({:?}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn rank_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env(ROLE_VAR, "rank");
    for var in CLEARED {
        cmd.env_remove(var);
    }
    cmd
}

const RANK_ARGS: [&str; 5] = [
    "rank_process",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// Rank `rank` of a 2-rank job, started directly (no launcher), with `extra` variables.
fn spawn_rank(port: u16, rank: usize, delays: &str, extra: &[(String, String)]) -> Child {
    let mut cmd = rank_command(std::env::current_exe().unwrap().to_str().unwrap());
    cmd.args(RANK_ARGS)
        .env("WORLD_RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("WORLD_LOCAL_RANK", rank.to_string())
        .env("WORLD_LOCAL_SIZE", "2")
        .env("NVFIPC_STORE_ADDR", format!("127.0.0.1:{port}"))
        .env(DELAYS_VAR, delays);
    cmd.envs(extra.iter().map(|(k, v)| (k, v)));
    cmd.spawn().expect("spawn a rank")
}

/// Waits for a process, killing it past `limit`.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Ranks' delays per round: the first pair all at once, then growing gaps, then the orders in
/// which one rank of each job comes first and the other two only after that pair has finished
/// (the order that paired ranks of two jobs by arrival).
const ROUNDS: [[[u64; 2]; 2]; 8] = [
    [[0, 0], [0, 0]],
    [[0, 30], [30, 0]],
    [[0, 150], [150, 0]],
    [[0, 1500], [1500, 0]],
    [[1500, 0], [0, 1500]],
    [[0, 400], [0, 400]],
    [[0, 1500], [1500, 0]],
    [[1500, 0], [0, 1500]],
];

fn delays(pair: [u64; 2]) -> String {
    format!("{},{}", pair[0], pair[1])
}

/// For each job (its two ranks' outcomes): it joined alone (both ranks share a job id that no
/// rank of the other job has), or a rank of it failed with the named error. `require_alone`:
/// the first only.
fn check_round(round: usize, jobs: &[[Outcome; 2]; 2], require_alone: bool) {
    let ids = |job: &[Outcome; 2]| -> Vec<String> {
        job.iter()
            .filter_map(|o| match o {
                Outcome::Joined(id) => Some(id.clone()),
                Outcome::Failed(_) => None,
            })
            .collect()
    };
    for (j, job) in jobs.iter().enumerate() {
        let mine = ids(job);
        let theirs = ids(&jobs[1 - j]);
        let alone = mine.len() == 2 && mine[0] == mine[1] && !theirs.contains(&mine[0]);
        let refused = job
            .iter()
            .any(|o| matches!(o, Outcome::Failed(e) if e.contains(NAMED)));
        assert!(
            alone || (refused && !require_alone),
            "round {round}: job {} neither ran alone nor was refused with the named error: \
             {jobs:#?}",
            ["A", "B"][j]
        );
    }
}

#[test]
fn simultaneous_untagged_jobs_fail_rather_than_mix() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let mut refused_rounds = 0;
    for (round, pattern) in ROUNDS.iter().enumerate() {
        let children: Vec<[Child; 2]> = pattern
            .iter()
            .map(|job| [0, 1].map(|r| spawn_rank(server.port(), r, &delays(*job), &[])))
            .collect();
        let jobs: Vec<[Outcome; 2]> = children
            .into_iter()
            .map(|job| job.map(|c| Outcome::from_output(&finish(c, Duration::from_secs(60)))))
            .collect();
        let jobs: [[Outcome; 2]; 2] = jobs.try_into().unwrap();
        eprintln!("round {round} (delays {pattern:?}): {jobs:?}");
        check_round(round, &jobs, false);
        if jobs
            .iter()
            .flatten()
            .any(|o| matches!(o, Outcome::Failed(_)))
        {
            refused_rounds += 1;
        }
    }
    // Every round started both jobs together: some of them must have been caught.
    assert!(refused_rounds > 0);
}

/// Launcher ids: each job's ranks carry their launcher's variables, as that launcher sets them.
fn launcher_vars(round: usize, job: usize) -> Vec<(String, String)> {
    let id = format!("{round}x{job}");
    let vars: Vec<(&str, String)> = match round % 5 {
        0 => vec![("NVFIPC_LAUNCH_ID", format!("launch-{id}"))],
        1 => vec![
            (
                "OMPI_MCA_orte_hnp_uri",
                format!("3181903872.0;tcp://10.0.0.1:4{id}"),
            ),
            ("OMPI_MCA_ess_base_jobid", "3181903873".to_string()),
        ],
        2 => vec![("PMIX_NAMESPACE", format!("prterun-node0-{id}@1"))],
        3 => vec![("TORCHELASTIC_RUN_ID", id)],
        _ => vec![
            ("SLURM_JOB_ID", format!("77{round}")),
            ("SLURM_STEP_ID", job.to_string()),
        ],
    };
    vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[test]
fn simultaneous_jobs_with_launcher_ids_never_mix() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    for (round, pattern) in ROUNDS.iter().chain(&ROUNDS[3..5]).enumerate() {
        let children: Vec<[Child; 2]> = pattern
            .iter()
            .enumerate()
            .map(|(j, job)| {
                let vars = launcher_vars(round, j);
                [0, 1].map(|r| spawn_rank(server.port(), r, &delays(*job), &vars))
            })
            .collect();
        let jobs: Vec<[Outcome; 2]> = children
            .into_iter()
            .map(|job| job.map(|c| Outcome::from_output(&finish(c, Duration::from_secs(60)))))
            .collect();
        check_round(round, &jobs.try_into().unwrap(), true);
    }
}

/// Two `nvfipc launch` jobs whose ranks use one long-lived store (instead of the launcher's
/// own): the id each launch exports keeps them apart.
#[test]
fn two_nvfipc_launch_jobs_on_one_store_never_mix() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let exe = std::env::current_exe().unwrap();
    for (round, pattern) in ROUNDS[2..5].iter().enumerate() {
        let launches: Vec<Child> = pattern
            .iter()
            .map(|job| {
                let mut cmd = rank_command(NVFIPC);
                cmd.args(["launch", "-n", "2", "--", "env"])
                    .arg(format!("NVFIPC_STORE_ADDR=127.0.0.1:{}", server.port()))
                    .arg(format!("{DELAYS_VAR}={}", delays(*job)))
                    .arg(&exe)
                    .args(RANK_ARGS);
                cmd.spawn().expect("spawn nvfipc launch")
            })
            .collect();
        let outputs: Vec<Output> = launches
            .into_iter()
            .map(|c| finish(c, Duration::from_secs(60)))
            .collect();
        let mut jobs = Vec::new();
        for out in &outputs {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let job = [0, 1].map(|r| {
                let prefix = format!("[rank {r}] ");
                let mine: String = stdout
                    .lines()
                    .filter_map(|l| l.strip_prefix(&prefix))
                    .map(|l| format!("{l}\n"))
                    .collect();
                Outcome::from_output(&Output {
                    status: out.status,
                    stdout: mine.into_bytes(),
                    stderr: out.stderr.clone(),
                })
            });
            jobs.push(job);
        }
        check_round(round, &jobs.try_into().unwrap(), true);
    }
}
