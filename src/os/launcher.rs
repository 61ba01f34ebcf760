//! What a launcher (mpirun, torchrun, srun) tells a process about its place on the node.
//!
//! The CUDA transport picks its default device from the local rank, and `env` reads every launcher
//! variable: both read the list from here, so neither depends on the other.

/// Rank on this node, first set wins.
pub const LOCAL_RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "WORLD_LOCAL_RANK",
    "LOCAL_RANK",
    "SLURM_LOCALID",
];

/// The launcher's local rank (the first of [`LOCAL_RANK_VARS`] set), read through `lookup`.
pub fn local_rank_from(lookup: impl Fn(&str) -> Option<String>) -> Option<usize> {
    LOCAL_RANK_VARS
        .iter()
        .find_map(|var| lookup(var))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests;
