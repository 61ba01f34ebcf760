//! C ABI of barriers over the world or any subset of ranks.

use super::args::{check_not_null, count_arg, rank_arg, slice_arg};
use super::boundary::ffi_call;
use super::context::{context_arg, nvfipc_context};
use crate::error::{Result, Status};
use std::time::Duration;

/// Converts the C rank list; `None` (the world) when it is empty.
pub(crate) fn members_arg(ranks: *const i64, n: usize, world: usize) -> Result<Option<Vec<usize>>> {
    if n == 0 {
        return Ok(None);
    }
    // Checked before the list is read: it names each rank of the world at most once.
    check_not_null(ranks, "ranks")?;
    count_arg(n, "n_ranks", "the world size", world)?;
    let mut members = Vec::with_capacity(n);
    for (i, &r) in slice_arg(ranks, n, "ranks")?.iter().enumerate() {
        members.push(rank_arg(r, world, format_args!("ranks[{i}]"))?);
    }
    Ok(Some(members))
}

/// Blocks until every rank of `ranks[0..n_ranks]` (the whole world when `n_ranks` is 0; `ranks`
/// may then be NULL) has entered the same barrier. The list must contain this rank, no
/// duplicates, and only ranks below the world size (so `n_ranks` is at most the world size); its
/// order does not matter. Barriers are reusable: the members of a set must simply call the same
/// number of barriers on it.
/// `timeout_ms` < 0 uses the context's default, 0 checks once without waiting. On timeout the
/// status is `NVFIPC_STATUS_TIMEOUT` and the message names the ranks that did not arrive; the
/// job should then stop, as the set's barrier state is out of step. The context's first barrier
/// also fails, with `NVFIPC_STATUS_INVALID_STATE`, when another process has claimed this rank of
/// the job (see `nvfipc_context_create`).
#[no_mangle]
pub extern "C" fn nvfipc_barrier(
    ctx: *const nvfipc_context,
    ranks: *const i64,
    n_ranks: usize,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_barrier", || {
        let ctx = context_arg(ctx)?;
        let members = members_arg(ranks, n_ranks, ctx.world_size)?;
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        ctx.barrier(members.as_deref(), timeout)?;
        Ok(())
    })
}
