//! Every environment variable the library reads, read here and nowhere else; docs/CONFIGURATION.md
//! lists each one (default, meaning, reader). In each list of the launchers' variables the first
//! set wins, as in nvFuser's communicator; torchrun's names come before SLURM's (under `srun
//! torchrun` the SLURM ids describe the node's task, not the worker). Parsers take a lookup
//! closure (variable name to value), so they are tested without touching the process environment.

use crate::error::{Error, Result};
use log::LevelFilter;
use std::fmt;
use std::path::PathBuf;
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

/// A rank's place in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankInfo {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
}

impl RankInfo {
    /// Checks the relations between the four numbers.
    pub fn new(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        local_world_size: usize,
    ) -> Result<RankInfo> {
        if world_size == 0 {
            return Err(Error::invalid("the world size must be at least 1, got 0"));
        }
        if world_size > MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "the world size {world_size} is above the limit of {MAX_WORLD_SIZE} ranks"
            )));
        }
        if local_world_size == 0 || local_world_size > world_size {
            return Err(Error::invalid(format!(
                "the local world size must be between 1 and the world size {world_size}, got \
                 {local_world_size}"
            )));
        }
        if rank >= world_size {
            return Err(Error::invalid(format!(
                "rank {rank} is not below the world size {world_size}"
            )));
        }
        if local_rank >= local_world_size {
            return Err(Error::invalid(format!(
                "local rank {local_rank} is not below the local world size {local_world_size}"
            )));
        }
        Ok(RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<RankInfo> {
        Self::from_lookup(process_env)
    }

    /// Reads the four numbers through `lookup` (variable name to value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<RankInfo> {
        let lists = [
            (RANK_VARS, "this process's rank"),
            (WORLD_SIZE_VARS, "the number of ranks"),
            (LOCAL_RANK_VARS, "its rank on this node"),
            (LOCAL_WORLD_SIZE_VARS, "the number of ranks on this node"),
        ];
        let found = lists.map(|(vars, _)| first_set(&lookup, vars));
        let missing: Vec<String> = (lists.iter().zip(&found))
            .filter(|(_, f)| f.is_none())
            .map(|((vars, what), _)| format!("{what} (none of {} is set)", vars.join("/")))
            .collect();
        if missing.len() == lists.len() {
            return Err(Error::not_found(format!(
                "no rank variables in the environment (looked for {}); start the program with \
                 mpirun, srun, torchrun or `nvfipc launch`",
                missing.join(", ")
            )));
        }
        if !missing.is_empty() {
            return Err(Error::invalid(format!(
                "incomplete rank environment: {} missing; set one variable of each list (mpirun, \
                 srun, torchrun and `nvfipc launch` set them all; on one node, the local size and \
                 rank equal the world size and rank)",
                missing.join(" and ")
            )));
        }
        let mut numbers = [0usize; 4];
        let mut names = [""; 4];
        for (i, (var, value)) in found.into_iter().flatten().enumerate() {
            numbers[i] = (value.trim().parse()).map_err(|_| {
                Error::invalid(format!("{var}={value:?} is not a non-negative integer"))
            })?;
            names[i] = var;
        }
        let [rank, world, local_rank, local_world] = numbers;
        Self::new(rank, world, local_rank, local_world).map_err(|e| {
            Error::new(
                e.status,
                format!(
                    "{} (from {}={rank}, {}={world}, {}={local_rank}, {}={local_world})",
                    e.message, names[0], names[1], names[2], names[3]
                ),
            )
        })
    }
}

/// A host and a port. Displays IPv6 literals in brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    pub fn new(host: impl Into<String>, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    /// Parses `host:port` or `[ipv6]:port`; `var` names the source in errors.
    pub fn parse(var: &str, value: &str) -> Result<HostPort> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "{var}={value:?} is not a store address: {why} (expected host:port or \
                 [ipv6]:port)"
            ))
        };
        let trimmed = value.trim();
        let (host, port) = trimmed.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let host = match host.strip_prefix('[') {
            Some(inner) => inner.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?,
            None => host,
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let port = parse_port_value(port).ok_or_else(|| bad("the port is not in 1..=65535"))?;
        Ok(HostPort::new(host, port))
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Where the job's store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSource {
    /// `NVFIPC_STORE_ADDR`: a store that is already running; everyone connects, nobody hosts.
    External(HostPort),
    /// The master address: local rank 0 on the master host hosts the store, everyone connects.
    Master(HostPort),
}

impl StoreSource {
    pub fn addr(&self) -> &HostPort {
        match self {
            StoreSource::External(a) | StoreSource::Master(a) => a,
        }
    }
}

/// Everything the environment says about the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfig {
    pub ranks: RankInfo,
    pub store: StoreSource,
    /// `NVFIPC_TIMEOUT_MS`, when set.
    pub timeout: Option<Duration>,
    /// A name for this run of the job from the launcher, when it gives one (see [`JOB_TAG_VARS`]),
    /// and the variable it came from.
    pub job_tag: Option<(String, &'static str)>,
    /// The variable the world size came from.
    pub world_from: &'static str,
}

impl EnvConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<EnvConfig> {
        Self::from_lookup(process_env)
    }

    /// Reads through `lookup` (variable name to value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<EnvConfig> {
        let ranks = RankInfo::from_lookup(&lookup)?;
        let store = match lookup(STORE_ADDR_VAR) {
            Some(value) => StoreSource::External(HostPort::parse(STORE_ADDR_VAR, &value)?),
            None => StoreSource::Master(master_from_lookup(&lookup, &ranks)?),
        };
        Ok(EnvConfig {
            ranks,
            store,
            timeout: timeout_from_lookup(&lookup)?,
            job_tag: job_tag_from_lookup(&lookup),
            world_from: first_set(&lookup, WORLD_SIZE_VARS).map_or("", |(var, _)| var),
        })
    }
}

/// The master address and port: `NVFUSER_MASTER_ADDR`/`MASTER_ADDR` ("localhost" when every rank
/// is on this node) and `NVFUSER_MASTER_PORT`/`MASTER_PORT` (default 29542).
pub fn master_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    ranks: &RankInfo,
) -> Result<HostPort> {
    let single_node = ranks.local_world_size == ranks.world_size;
    let host = match first_set(&lookup, MASTER_ADDR_VARS) {
        Some((var, value)) => {
            let host = value.trim();
            if host.is_empty() {
                return Err(Error::invalid(format!(
                    "{var} is set but empty; give the store host's name or address"
                )));
            }
            if !single_node && is_loopback_name(host) {
                return Err(Error::invalid(format!(
                    "{var}={host} is a loopback address, but the job spans several nodes (world \
                     size {}, {} on this node); give an address the other nodes can reach",
                    ranks.world_size, ranks.local_world_size
                )));
            }
            host.to_string()
        }
        None if single_node => "localhost".to_string(),
        None => {
            return Err(Error::invalid(format!(
                "the job spans several nodes (world size {}, {} on this node) but none of {} is \
                 set; set one to the host of local rank 0 on the master node, or set {} to a \
                 running store",
                ranks.world_size,
                ranks.local_world_size,
                MASTER_ADDR_VARS.join("/"),
                STORE_ADDR_VAR
            )))
        }
    };
    let port = match first_set(&lookup, MASTER_PORT_VARS) {
        Some((var, value)) => parse_port_value(&value).ok_or_else(|| {
            Error::invalid(format!(
                "{var}={value:?} is not a port number (expected 1..=65535)"
            ))
        })?,
        None => DEFAULT_MASTER_PORT,
    };
    Ok(HostPort::new(host, port))
}

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

fn first_set<'a>(
    lookup: &impl Fn(&str) -> Option<String>,
    vars: &[&'a str],
) -> Option<(&'a str, String)> {
    vars.iter().find_map(|&var| lookup(var).map(|v| (var, v)))
}

fn parse_port_value(value: &str) -> Option<u16> {
    value.trim().parse::<u16>().ok().filter(|&p| p > 0)
}

// The log (read once, by `logging::init`).

/// The log's level: `OFF`, `WARN` (the default), `INFO`, `DEBUG` or `TRACE`, any case.
pub const DEBUG_VAR: &str = "NVFIPC_DEBUG";
/// The log's subsystems: `store,exchange`, `ALL`, or `^server,cuda` to exclude (as NCCL reads).
pub const DEBUG_SUBSYS_VAR: &str = "NVFIPC_DEBUG_SUBSYS";
/// The log's file (appended) instead of stderr; `%h`: the host name, `%p`: the pid.
pub const DEBUG_FILE_VAR: &str = "NVFIPC_DEBUG_FILE";

/// The log's configuration; malformed values become the log's first lines, not errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    pub level: LevelFilter,
    /// Bit `Subsystem as u32` set: that subsystem's lines are written.
    pub subsystems: u32,
    /// The file, with `%h`/`%p` already expanded; `None`: stderr.
    pub file: Option<String>,
    /// Malformed values, one message each, written as WARN lines once the sink exists.
    pub problems: Vec<String>,
}

impl LogConfig {
    /// Reads the process environment.
    pub fn from_env(host: &str, pid: u32) -> Self {
        Self::from_lookup(process_env_utf8, host, pid)
    }

    /// Reads the configuration through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, host: &str, pid: u32) -> Self {
        let mut problems = Vec::new();
        let level = match lookup(DEBUG_VAR) {
            None => LevelFilter::Warn,
            Some(v) => parse_level(&v).unwrap_or_else(|| {
                problems.push(format!(
                    "{DEBUG_VAR}={v:?} is not a level (OFF, WARN, INFO, DEBUG or TRACE); \
                     logging at WARN"
                ));
                LevelFilter::Warn
            }),
        };
        let subsystems = match lookup(DEBUG_SUBSYS_VAR) {
            None => Subsystem::ALL_MASK,
            Some(v) => parse_subsystems(&v).unwrap_or_else(|bad| {
                problems.push(format!(
                    "{DEBUG_SUBSYS_VAR}={v:?}: {bad:?} is not a subsystem (one of {}, or ALL); \
                     logging every subsystem",
                    Subsystem::ALL.map(Subsystem::name).join(", ")
                ));
                Subsystem::ALL_MASK
            }),
        };
        let file = match lookup(DEBUG_FILE_VAR) {
            Some(v) if v.trim().is_empty() => {
                problems.push(format!("{DEBUG_FILE_VAR} is empty; logging to stderr"));
                None
            }
            Some(v) => Some(expand_path(&v, host, pid)),
            None => None,
        };
        LogConfig {
            level,
            subsystems,
            file,
            problems,
        }
    }
}

/// Parses a level name; `None` when it is not one.
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    match text.trim().to_ascii_uppercase().as_str() {
        "OFF" | "NONE" => Some(LevelFilter::Off),
        "WARN" | "WARNING" => Some(LevelFilter::Warn),
        "INFO" => Some(LevelFilter::Info),
        "DEBUG" => Some(LevelFilter::Debug),
        "TRACE" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// Parses a subsystem list into a mask; `Err` names the first unknown entry.
pub fn parse_subsystems(text: &str) -> Result<u32, String> {
    let text = text.trim();
    let list = text.strip_prefix('^').unwrap_or(text);
    let exclude = list.len() < text.len();
    let mut mask = 0u32;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.eq_ignore_ascii_case("all") {
            mask |= Subsystem::ALL_MASK;
            continue;
        }
        match Subsystem::from_name(name) {
            Some(s) => mask |= s.bit(),
            None => return Err(name.to_string()),
        }
    }
    Ok(if exclude {
        Subsystem::ALL_MASK & !mask
    } else {
        mask
    })
}

/// Expands `%h` (host name) and `%p` (pid) in a log file path; `%%` is a literal `%`.
pub fn expand_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match (c == '%').then(|| chars.next()).flatten() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') | None => out.push(c),
            Some(other) => out.extend(['%', other]),
        }
    }
    out
}

// The fd transport (`crate::fdpass`).

/// Directory of the responders' path sockets; `none`: no path socket.
pub const SOCKET_DIR_VAR: &str = "NVFIPC_SOCKET_DIR";
/// Rungs an importer tries, in order, comma-separated (default `abstract,path,pidfd`).
pub const RUNGS_VAR: &str = "NVFIPC_FD_RUNGS";
/// `any`: `PR_SET_PTRACER_ANY` under Yama `ptrace_scope=1`, for the pidfd rung; `none`: never.
pub const PTRACER_VAR: &str = "NVFIPC_FD_PTRACER";
/// Uids, besides this process's own, whose processes may serve this job memory and receive it.
pub const TRUSTED_UIDS_VAR: &str = "NVFIPC_TRUSTED_UIDS";
/// Most uids [`TRUSTED_UIDS_VAR`] may name.
const MAX_TRUSTED_UIDS: usize = 64;

/// The uids whose processes are inside a job's trust boundary (docs/PROTOCOL.md section 7,
/// "Trust boundary"): this process's effective uid, and those [`TRUSTED_UIDS_VAR`] adds for a
/// job whose ranks run as several users. The kernel's word about a peer (`SO_PEERCRED`, a file's
/// owner, a board's owner) is checked against it; nothing read from the store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedUids {
    own: u32,
    extra: Vec<u32>,
}

impl TrustedUids {
    /// This process's effective uid alone.
    pub fn own() -> TrustedUids {
        TrustedUids {
            own: crate::os::fd_passing::effective_uid(),
            extra: Vec::new(),
        }
    }

    /// Reads [`TRUSTED_UIDS_VAR`] from the process environment.
    pub fn from_env() -> Result<TrustedUids> {
        Self::from_lookup(crate::os::fd_passing::effective_uid(), process_env_utf8)
    }

    /// `own` and the comma-separated uids of [`TRUSTED_UIDS_VAR`] in `lookup`.
    pub fn from_lookup(own: u32, lookup: impl Fn(&str) -> Option<String>) -> Result<TrustedUids> {
        let mut extra = Vec::new();
        let Some(list) = lookup(TRUSTED_UIDS_VAR).filter(|s| !s.trim().is_empty()) else {
            return Ok(TrustedUids { own, extra });
        };
        for item in list.split(',').map(str::trim) {
            let uid = item.parse::<u32>().ok().filter(|&u| u != u32::MAX);
            let Some(uid) = uid else {
                return Err(Error::invalid(format!(
                    "{TRUSTED_UIDS_VAR}={list:?}: {item:?} is not a uid; give the numeric uids \
                     of the job's other users, comma-separated (e.g. 1001,1002)"
                )));
            };
            if uid != own && !extra.contains(&uid) {
                extra.push(uid);
            }
        }
        if extra.len() > MAX_TRUSTED_UIDS {
            return Err(Error::invalid(format!(
                "{TRUSTED_UIDS_VAR} names {} uids; at most {MAX_TRUSTED_UIDS} are allowed",
                extra.len()
            )));
        }
        Ok(TrustedUids { own, extra })
    }

    /// Whether a process (or file) of `uid` is inside the boundary.
    pub fn admits(&self, uid: u32) -> bool {
        uid == self.own || self.extra.contains(&uid)
    }

    /// This process's effective uid.
    pub fn own_uid(&self) -> u32 {
        self.own
    }

    /// The admitted uids for messages: `uid 1000`, or `uids 1000, 1001 (NVFIPC_TRUSTED_UIDS)`.
    pub fn describe(&self) -> String {
        if self.extra.is_empty() {
            return format!("uid {}", self.own);
        }
        let all: Vec<String> = std::iter::once(self.own)
            .chain(self.extra.iter().copied())
            .map(|u| u.to_string())
            .collect();
        format!("uids {} ({TRUSTED_UIDS_VAR})", all.join(", "))
    }
}

/// The fd transport's settings, from the environment or set by hand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdPassConfig {
    /// Where the path socket goes; `None`: abstract socket only.
    pub socket_dir: Option<PathBuf>,
    /// Rungs the importer tries, in order ([`Rung::Fabric`] is the VMM transport's).
    pub rungs: Vec<Rung>,
    /// [`PTRACER_VAR`]: off by default, it lets every process of this user attach.
    pub allow_ptracer: bool,
    /// How long an importer retries connecting to one socket before the next rung.
    pub connect_retry: Duration,
    /// A responder closes a connection that has been silent this long.
    pub idle_timeout: Duration,
    /// Connections a responder serves at once; more are answered "busy" and closed.
    pub max_connections: usize,
    /// Whose processes a responder serves and an importer accepts descriptors from.
    pub trusted: TrustedUids,
}

impl Default for FdPassConfig {
    fn default() -> Self {
        FdPassConfig {
            // `$XDG_RUNTIME_DIR` when it is an absolute directory, else `/tmp`.
            socket_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute() && p.is_dir())
                .or_else(|| Some(PathBuf::from("/tmp"))),
            rungs: vec![Rung::Abstract, Rung::Path, Rung::Pidfd],
            allow_ptracer: false,
            connect_retry: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(30),
            max_connections: 1024,
            trusted: TrustedUids::own(),
        }
    }
}

impl FdPassConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<FdPassConfig> {
        Self::from_lookup(process_env_utf8)
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<FdPassConfig> {
        let mut config = FdPassConfig {
            trusted: TrustedUids::from_lookup(crate::os::fd_passing::effective_uid(), &lookup)?,
            ..FdPassConfig::default()
        };
        if let Some(dir) = lookup(SOCKET_DIR_VAR).filter(|s| !s.is_empty()) {
            config.socket_dir = if dir == "none" {
                None
            } else if !dir.starts_with('/') {
                return Err(Error::invalid(format!(
                    "{SOCKET_DIR_VAR}={dir:?} is not an absolute path: give a directory every \
                     rank of the node can reach by one path, or `none`"
                )));
            } else {
                Some(PathBuf::from(dir))
            };
        }
        if let Some(list) = lookup(RUNGS_VAR).filter(|s| !s.trim().is_empty()) {
            let mut rungs = Vec::new();
            for name in list.split(',') {
                let rung = Rung::parse(name).ok_or_else(|| {
                    Error::invalid(format!(
                        "{RUNGS_VAR}={list:?}: {name:?} is not a rung; use a comma-separated \
                         list of abstract, path, pidfd, fabric"
                    ))
                })?;
                if !rungs.contains(&rung) {
                    rungs.push(rung);
                }
            }
            config.rungs = rungs;
        }
        if let Some(v) = lookup(PTRACER_VAR).filter(|s| !s.is_empty()) {
            config.allow_ptracer = match v.as_str() {
                "any" => true,
                "none" => false,
                _ => {
                    return Err(Error::invalid(format!(
                        "{PTRACER_VAR}={v:?}: use `none` (the default) or `any` (under Yama \
                         ptrace_scope=1, let any process of this user attach, for the pidfd \
                         rung)"
                    )))
                }
            };
        }
        Ok(config)
    }
}

// The vocabularies of NVFIPC_DEBUG_SUBSYS and NVFIPC_FD_RUNGS.

/// Targets of the library's log lines, one per subsystem.
pub const STORE: &str = nvfipc_store::CLIENT_LOG_TARGET;
pub const BARRIER: &str = "nvfipc::barrier";
pub const EXCHANGE: &str = "nvfipc::exchange";
pub const CUDA: &str = "nvfipc::cuda";
pub const HOST: &str = "nvfipc::host";
pub const SERVER: &str = nvfipc_store::SERVER_LOG_TARGET;

/// A part of the library whose lines can be selected with `NVFIPC_DEBUG_SUBSYS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Subsystem {
    /// Store client traffic: connections, keys set and read, waits.
    Store = 0,
    /// Barriers: arrivals, releases, who is missing.
    Barrier = 1,
    /// The handle exchange: channels, steps, versions, records, opens and releases.
    Exchange = 2,
    /// The CUDA transport: driver loading, IPC export/open/close, the releaser.
    Cuda = 3,
    /// The host transport: shared-memory segments and their cleanup.
    Host = 4,
    /// The embedded store server: connections accepted and refused, limits, bad frames.
    Server = 5,
}

impl Subsystem {
    pub const ALL: [Subsystem; 6] = [
        Subsystem::Store,
        Subsystem::Barrier,
        Subsystem::Exchange,
        Subsystem::Cuda,
        Subsystem::Host,
        Subsystem::Server,
    ];
    pub const ALL_MASK: u32 = (1 << Self::ALL.len()) - 1;

    /// `store`, `barrier`, ...: the target without its `nvfipc::`.
    pub fn name(self) -> &'static str {
        &self.target()["nvfipc::".len()..]
    }

    pub fn target(self) -> &'static str {
        [STORE, BARRIER, EXCHANGE, CUDA, HOST, SERVER][self as usize]
    }

    pub fn bit(self) -> u32 {
        1 << self as u32
    }

    pub fn from_name(name: &str) -> Option<Subsystem> {
        Self::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// The subsystem of a log target; `None` for targets outside this library (dependencies).
    pub fn from_target(target: &str) -> Option<Subsystem> {
        Self::ALL.into_iter().find(|s| s.target() == target)
    }
}

/// One way to obtain a peer's descriptor, in the order they are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rung {
    /// The peer's responder on its abstract socket (same network namespace only).
    Abstract,
    /// The peer's responder on its socket file in the socket directory.
    Path,
    /// `pidfd_open` + `pidfd_getfd` (ptrace rights over the peer).
    Pidfd,
    /// A CUDA FABRIC handle: not an fd; the VMM transport tries it and adds its outcome.
    Fabric,
}

/// Each rung (in discriminant order) with its name (in `NVFIPC_FD_RUNGS`) and its title.
const RUNGS: [(Rung, &str, &str); 4] = [
    (Rung::Abstract, "abstract", "abstract socket"),
    (Rung::Path, "path", "socket path"),
    (Rung::Pidfd, "pidfd", "pidfd_getfd"),
    (Rung::Fabric, "fabric", "FABRIC handle"),
];

impl Rung {
    pub fn name(self) -> &'static str {
        RUNGS[self as usize].1
    }

    pub fn parse(s: &str) -> Option<Rung> {
        RUNGS
            .iter()
            .find(|(_, name, _)| *name == s.trim())
            .map(|(r, ..)| *r)
    }

    pub(crate) fn title(self) -> &'static str {
        RUNGS[self as usize].2
    }
}

#[cfg(test)]
mod tests;
