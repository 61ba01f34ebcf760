//! The job's place and store as the environment gives them: the rank numbers and where the store
//! is, read through the variable lists of `crate::config`.

use crate::config::{
    first_set, is_loopback_name, job_tag_from_lookup, parse_port_value, process_env,
    timeout_from_lookup, DEFAULT_MASTER_PORT, LOCAL_RANK_VARS, LOCAL_WORLD_SIZE_VARS,
    MASTER_ADDR_VARS, MASTER_PORT_VARS, MAX_WORLD_SIZE, RANK_VARS, STORE_ADDR_VAR, WORLD_SIZE_VARS,
};
use crate::error::{Error, Result};
use std::fmt;
use std::time::Duration;

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

#[cfg(test)]
mod tests;
