//! Every environment variable the library reads, named here and nowhere else (a module's own settings
//! are parsed beside it: `context/env.rs`, `logging/config.rs`, `fdpass/config.rs`, through the
//! lookup plumbing below); docs/CONFIGURATION.md lists each one (default, meaning, reader). In each list of the launchers' variables the first
//! set wins, as in nvFuser's communicator; torchrun's names come before SLURM's (under `srun
//! torchrun` the SLURM ids describe the node's task, not the worker). Parsers take a lookup
//! closure (variable name to value), so they are tested without touching the process environment.

use crate::error::{Error, Result};
use std::time::Duration;

/// nvFuser's default master port (29500 + 42).
pub const DEFAULT_MASTER_PORT: u16 = 29542;

/// Global rank, first set wins.
pub const RANK_VARS: &[&str] = &["OMPI_COMM_WORLD_RANK", "WORLD_RANK", "RANK", "SLURM_PROCID"];
/// Number of ranks, first set wins.
pub const WORLD_SIZE_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"];
/// Rank on this node, first set wins (read by the CUDA transport too, so kept under `os`).
pub use crate::os::launcher::LOCAL_RANK_VARS;
/// Number of ranks on this node, first set wins.
pub const LOCAL_WORLD_SIZE_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "WORLD_LOCAL_SIZE",
    "LOCAL_WORLD_SIZE",
    "SLURM_NTASKS_PER_NODE",
];
/// Host of the store, first set wins.
pub const MASTER_ADDR_VARS: &[&str] = &["NVFUSER_MASTER_ADDR", "MASTER_ADDR"];
/// Port of the store, first set wins.
pub const MASTER_PORT_VARS: &[&str] = &["NVFUSER_MASTER_PORT", "MASTER_PORT"];
/// `host:port` of a store that is already running: every rank connects and nobody hosts.
pub const STORE_ADDR_VAR: &str = "NVFIPC_STORE_ADDR";
/// Default timeout of store operations, barriers and exchanges, in milliseconds.
pub const TIMEOUT_MS_VAR: &str = "NVFIPC_TIMEOUT_MS";
/// Event-loop threads of a store server embedded in this process (0: one per four cores).
pub const STORE_THREADS_VAR: &str = "NVFIPC_STORE_THREADS";
const MAX_STORE_THREADS: u64 = 64;
/// MiB of the aligned windows a VMM buffer's run is widened to (`crate::cuda::vmm_runs`); 0: none.
pub const VMM_WINDOW_MIB_VAR: &str = "NVFIPC_VMM_WINDOW_MIB";
pub const DEFAULT_VMM_WINDOW_MIB: u64 = 32;
pub const MAX_VMM_WINDOW_MIB: u64 = 4096;
/// The job of host segments allocated without one.
pub const HOST_JOB_ID_VAR: &str = "NVFIPC_JOB_ID";
/// A name the user gives one run of a job (overrides any launcher's).
pub const JOB_TAG_VAR: &str = "NVFIPC_JOB_TAG";
/// The id `nvfipc launch` gives each job it starts (random, one per launch).
pub const LAUNCH_ID_VAR: &str = "NVFIPC_LAUNCH_ID";
/// Variables that name one run of a job, first set wins: the user's tag, then the launchers' ids,
/// innermost first (torchrun's default `none` is skipped; PMIx: Open MPI 4/5, `srun --mpi=pmix`).
pub const JOB_TAG_VARS: &[&str] = &[
    JOB_TAG_VAR,
    LAUNCH_ID_VAR,
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
];
/// Open MPI 2 to 4 (ORTE) without a PMIx namespace: the URI of the job's mpirun (its address and
/// port: unique among the mpiruns alive at one time) and the job id under that mpirun.
pub const ORTE_JOB_VARS: [&str; 2] = ["OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid"];

/// Most ranks a job may have: a world barrier's coordinator WAITs for every other rank's key in
/// one request, which names at most `store::wire::MAX_KEY_COUNT` keys (checked equal there).
pub const MAX_WORLD_SIZE: usize = 131_072;

/// `var` as a number in `range`, `None` when unset; otherwise an error `<var>=<value> is not
/// <what>`.
fn number(
    lookup: impl Fn(&str) -> Option<String>,
    var: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<Option<u64>> {
    let Some(value) = lookup(var) else {
        return Ok(None);
    };
    match value.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(Error::invalid(format!("{var}={value:?} is not {what}"))),
    }
}

/// `NVFIPC_STORE_THREADS`: 1 when unset.
pub fn store_threads_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<usize> {
    let what =
        format!("a thread count: expected 1 to {MAX_STORE_THREADS}, or 0 for one per four cores");
    let n = number(lookup, STORE_THREADS_VAR, 0..=MAX_STORE_THREADS, &what)?;
    Ok(n.map_or(1, |n| n as usize))
}

/// `NVFIPC_VMM_WINDOW_MIB` in bytes (default [`DEFAULT_VMM_WINDOW_MIB`]); 0 turns widening off.
pub fn vmm_window_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<u64> {
    let what = format!(
        "a window: expected 0 (each VMM buffer exported as the allocations it spans) to \
         {MAX_VMM_WINDOW_MIB} MiB (default {DEFAULT_VMM_WINDOW_MIB})"
    );
    let mib = number(lookup, VMM_WINDOW_MIB_VAR, 0..=MAX_VMM_WINDOW_MIB, &what)?;
    Ok(mib.unwrap_or(DEFAULT_VMM_WINDOW_MIB) << 20)
}

/// `NVFIPC_TIMEOUT_MS` as a duration (at least 1 ms), or `None` when unset.
pub fn timeout_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
    let what = "a timeout: expected a positive number of milliseconds";
    Ok(number(lookup, TIMEOUT_MS_VAR, 1..=u64::MAX, what)?.map(Duration::from_millis))
}

/// `NVFIPC_JOB_ID`: the job named in host segments allocated without a job (`host::alloc`),
/// `nojob` when unset.
pub fn host_job_id() -> String {
    process_env_utf8(HOST_JOB_ID_VAR).unwrap_or_else(|| "nojob".to_string())
}

/// The launcher's name for this run (see [`JOB_TAG_VARS`], then [`ORTE_JOB_VARS`], then
/// `SLURM_JOB_ID.SLURM_STEP_ID`), reduced to `[A-Za-z0-9._-]` so that it can be part of a store
/// key, with the variable it came from; `None` when there is none (the job is untagged).
pub fn job_tag_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Option<(String, &'static str)> {
    let named = |var: &str| {
        lookup(var).map(|v| v.trim().to_string()).filter(|v| {
            let torchrun_default = var == "TORCHELASTIC_RUN_ID" && v == "none";
            !v.is_empty() && !torchrun_default
        })
    };
    let (raw, var) = JOB_TAG_VARS
        .iter()
        .find_map(|&var| Some((named(var)?, var)))
        .or_else(|| {
            // The URI may be long and list several addresses: its hash keeps the key short.
            let uri = named(ORTE_JOB_VARS[0])?;
            let job = named(ORTE_JOB_VARS[1]).unwrap_or_default();
            let hash = crate::hash::fnv1a64(uri.as_bytes());
            Some((format!("ompi-{job}-{hash:016x}"), ORTE_JOB_VARS[0]))
        })
        .or_else(|| {
            let job = named("SLURM_JOB_ID")?;
            let step = named("SLURM_STEP_ID").map_or(String::new(), |s| format!(".{s}"));
            Some((format!("{job}{step}"), "SLURM_JOB_ID"))
        })?;
    let tag = crate::names::name_safe(&raw);
    (!tag.is_empty()).then_some((tag, var))
}

/// True for names that always mean this machine's loopback interface.
pub fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || (host.parse::<std::net::IpAddr>()).is_ok_and(|ip| ip.is_loopback())
}

/// The process environment. A value that is not valid UTF-8 is passed on lossily so that it is
/// reported, not ignored.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// The process environment where a value that is not UTF-8 counts as unset (the log's, the fd
/// transport's, the local rank and `NVFIPC_JOB_ID`).
pub(crate) fn process_env_utf8(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

pub(crate) fn first_set<'a>(
    lookup: &impl Fn(&str) -> Option<String>,
    vars: &[&'a str],
) -> Option<(&'a str, String)> {
    vars.iter().find_map(|&var| lookup(var).map(|v| (var, v)))
}

pub(crate) fn parse_port_value(value: &str) -> Option<u16> {
    value.trim().parse::<u16>().ok().filter(|&p| p > 0)
}

// The log (read once, by `logging::init`).

/// The log's level: `OFF`, `WARN` (the default), `INFO`, `DEBUG` or `TRACE`, any case.
pub const DEBUG_VAR: &str = "NVFIPC_DEBUG";
/// The log's subsystems: `store,exchange`, `ALL`, or `^server,cuda` to exclude (as NCCL reads).
pub const DEBUG_SUBSYS_VAR: &str = "NVFIPC_DEBUG_SUBSYS";
/// The log's file (appended) instead of stderr; `%h`: the host name, `%p`: the pid.
pub const DEBUG_FILE_VAR: &str = "NVFIPC_DEBUG_FILE";

// The fd transport (`crate::fdpass`).

/// Directory of the responders' path sockets; `none`: no path socket.
pub const SOCKET_DIR_VAR: &str = "NVFIPC_SOCKET_DIR";
/// Rungs an importer tries, in order, comma-separated (default `abstract,path,pidfd`).
pub const RUNGS_VAR: &str = "NVFIPC_FD_RUNGS";
/// `any`: `PR_SET_PTRACER_ANY` under Yama `ptrace_scope=1`, for the pidfd rung; `none`: never.
pub const PTRACER_VAR: &str = "NVFIPC_FD_PTRACER";
/// Uids, besides this process's own, whose processes may serve this job memory and receive it.
pub const TRUSTED_UIDS_VAR: &str = "NVFIPC_TRUSTED_UIDS";

#[cfg(test)]
mod tests;
