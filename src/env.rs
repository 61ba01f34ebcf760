//! Who we are (rank, world, local rank) and where the store is, from the launcher's environment.
//!
//! Understands nvFuser's variables (Open MPI, `WORLD_*`, SLURM, `NVFUSER_MASTER_*`), torchrun's
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and our
//! own (`NVFIPC_STORE_ADDR`, `NVFIPC_TIMEOUT_MS`). In each list the first variable that is set
//! wins, as in nvFuser's communicator. torchrun's names come before SLURM's: under `srun torchrun`
//! the SLURM ids describe the node's task, not the worker.
//!
//! The parsers take a lookup closure, so they are tested without touching the process
//! environment; `from_env` functions pass `std::env::var`.

use crate::error::{Error, Result, Status};
use crate::store::server::ServerOptions;
use std::fmt;
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
/// Event-loop threads of a store server embedded in this process (default 1; 0: one per four
/// cores, at most four).
pub const STORE_THREADS_VAR: &str = "NVFIPC_STORE_THREADS";
/// Most event-loop threads `NVFIPC_STORE_THREADS` may ask for.
const MAX_STORE_THREADS: usize = 64;
/// A name the user gives one run of a job (overrides any launcher's).
pub const JOB_TAG_VAR: &str = "NVFIPC_JOB_TAG";
/// The id `nvfipc launch` gives each job it starts (random, one per launch).
pub const LAUNCH_ID_VAR: &str = "NVFIPC_LAUNCH_ID";
/// Variables that name one run of a job, first set wins: the user's tag, then the launchers'
/// ids, innermost launcher first: `nvfipc launch`'s, torchrun's run id (its default `none` names
/// nothing and is skipped), the PMIx namespace (Open MPI 5, Open MPI 4 with PMIx, `srun
/// --mpi=pmix`). Then Open MPI's ORTE job ([`ORTE_JOB_VARS`]) and last SLURM's job and step ids.
pub const JOB_TAG_VARS: &[&str] = &[
    JOB_TAG_VAR,
    LAUNCH_ID_VAR,
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
];
/// Open MPI 2 to 4 (ORTE) without a PMIx namespace: the URI of the job's mpirun (its address and
/// port: unique among the mpiruns alive at one time) and the job id under that mpirun.
pub const ORTE_JOB_VARS: [&str; 2] = ["OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid"];

/// Most ranks a job may have. A world barrier's coordinator waits for every other rank's key
/// in one WAIT, and a TCPStore request names at most this many keys.
pub const MAX_WORLD_SIZE: usize = crate::store::wire::MAX_KEY_COUNT;

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
            RANK_VARS,
            WORLD_SIZE_VARS,
            LOCAL_RANK_VARS,
            LOCAL_WORLD_SIZE_VARS,
        ];
        let found: Vec<Option<(&str, String)>> =
            lists.iter().map(|vars| first_set(&lookup, vars)).collect();
        if found.iter().all(Option::is_none) {
            return Err(Error::not_found(format!(
                "no rank variables in the environment (looked for {}); start the program with \
                 mpirun, srun, torchrun or `nvfipc launch`",
                lists.map(|l| l.join("/")).join(", ")
            )));
        }
        let missing: Vec<String> = lists
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(vars, _)| vars.join("/"))
            .collect();
        if !missing.is_empty() {
            return Err(Error::invalid(format!(
                "incomplete rank environment: none of {} is set",
                missing.join(", and none of ")
            )));
        }
        let mut numbers = [0usize; 4];
        let mut names = [""; 4];
        for (i, (var, value)) in found.into_iter().flatten().enumerate() {
            numbers[i] = parse_count(var, &value)?;
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
    /// A name for this run of the job from the launcher, when it gives one (see [`JOB_TAG_VARS`]).
    pub job_tag: Option<String>,
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

/// `NVFIPC_STORE_THREADS` (see [`STORE_THREADS_VAR`]): 1 when unset.
pub fn store_threads_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<usize> {
    let Some(value) = lookup(STORE_THREADS_VAR) else {
        return Ok(1);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if n <= MAX_STORE_THREADS => Ok(n),
        _ => Err(Error::invalid(format!(
            "{STORE_THREADS_VAR}={value:?} is not a thread count: expected 1 to \
             {MAX_STORE_THREADS}, or 0 for one per four cores"
        ))),
    }
}

/// Options for a store server embedded in this process, from the environment.
pub fn embedded_server_options() -> Result<ServerOptions> {
    Ok(ServerOptions {
        threads: store_threads_from_lookup(process_env)?,
        ..ServerOptions::default()
    })
}

/// Span in MiB of the aligned windows an exchanged VMM buffer's run is widened to
/// (`crate::cuda::vmm_runs`); 0 exports each buffer's exact run.
pub const VMM_WINDOW_MIB_VAR: &str = "NVFIPC_VMM_WINDOW_MIB";
/// The window when `NVFIPC_VMM_WINDOW_MIB` is unset.
pub const DEFAULT_VMM_WINDOW_MIB: u64 = 32;
/// Largest window `NVFIPC_VMM_WINDOW_MIB` may ask for.
pub const MAX_VMM_WINDOW_MIB: u64 = 4096;

/// `NVFIPC_VMM_WINDOW_MIB` (see [`VMM_WINDOW_MIB_VAR`]) in bytes; 0 turns widening off.
pub fn vmm_window_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<u64> {
    let Some(value) = lookup(VMM_WINDOW_MIB_VAR) else {
        return Ok(DEFAULT_VMM_WINDOW_MIB << 20);
    };
    match value.trim().parse::<u64>() {
        Ok(mib) if mib <= MAX_VMM_WINDOW_MIB => Ok(mib << 20),
        _ => Err(Error::invalid(format!(
            "{VMM_WINDOW_MIB_VAR}={value:?} is not a window: expected 0 (each VMM buffer \
             exported as the allocations it spans) to {MAX_VMM_WINDOW_MIB} MiB (default \
             {DEFAULT_VMM_WINDOW_MIB})"
        ))),
    }
}

/// `NVFIPC_TIMEOUT_MS` as a duration (at least 1 ms), or `None` when unset.
pub fn timeout_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
    let Some(value) = lookup(TIMEOUT_MS_VAR) else {
        return Ok(None);
    };
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(Error::invalid(format!(
            "{TIMEOUT_MS_VAR}={value:?} is not a timeout: expected a positive number of \
             milliseconds"
        ))),
    }
}

/// The launcher's name for this run (see [`JOB_TAG_VARS`], then [`ORTE_JOB_VARS`], then
/// `SLURM_JOB_ID.SLURM_STEP_ID`), reduced to `[A-Za-z0-9._-]` so that it can be part of a store
/// key; `None` when there is none (the job is untagged).
pub fn job_tag_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    let named = |var: &str| {
        lookup(var).map(|v| v.trim().to_string()).filter(|v| {
            let torchrun_default = var == "TORCHELASTIC_RUN_ID" && v == "none";
            !v.is_empty() && !torchrun_default
        })
    };
    let raw = JOB_TAG_VARS
        .iter()
        .find_map(|var| named(var))
        .or_else(|| {
            // The URI may be long and list several addresses: its hash keeps the key short.
            let uri = named(ORTE_JOB_VARS[0])?;
            let job = named(ORTE_JOB_VARS[1]).unwrap_or_default();
            Some(format!(
                "ompi-{job}-{:016x}",
                crate::hash::fnv1a64(uri.as_bytes())
            ))
        })
        .or_else(|| {
            let job = named("SLURM_JOB_ID")?;
            Some(match named("SLURM_STEP_ID") {
                Some(step) => format!("{job}.{step}"),
                None => job,
            })
        })?;
    let tag: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    (!tag.is_empty()).then_some(tag)
}

/// True for names that always mean this machine's loopback interface.
pub fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

pub(crate) fn process_env(name: &str) -> Option<String> {
    // A value that is not valid UTF-8 is passed on lossily so that it is reported, not ignored.
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

fn first_set<'a>(
    lookup: &impl Fn(&str) -> Option<String>,
    vars: &[&'a str],
) -> Option<(&'a str, String)> {
    vars.iter().find_map(|&var| lookup(var).map(|v| (var, v)))
}

fn parse_count(var: &str, value: &str) -> Result<usize> {
    value.trim().parse::<usize>().map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("{var}={value:?} is not a non-negative integer"),
        )
    })
}

fn parse_port_value(value: &str) -> Option<u16> {
    value.trim().parse::<u16>().ok().filter(|&p| p > 0)
}

#[cfg(test)]
mod tests;
