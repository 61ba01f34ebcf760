//! C ABI of the job context: who this rank is and which store the job shares.

use super::args::{c_str_arg, out_ptr, positive_arg, rank_arg, timeout_arg};
use super::boundary::ffi_call;
use super::registry::{handle_ref, into_handle, take_handle, Handle};
use super::store::nvfipc_store;
use crate::config::MAX_WORLD_SIZE;
use crate::context::{Context, ContextOptions, EnvOptions};
use crate::error::{Error, Result, Status};
use crate::store::DEFAULT_TIMEOUT;
use std::ffi::{c_char, CString};
use std::sync::Arc;

/// Most ranks a job may have (`world_size` of every context, members of every barrier): a world
/// barrier waits for every other rank's key in one store request, which names at most this many.
pub const NVFIPC_MAX_WORLD_SIZE: i64 = 131_072;
const _: () = assert!(NVFIPC_MAX_WORLD_SIZE as usize == MAX_WORLD_SIZE);

/// One rank's view of the job: rank, world size, local rank and size, the store every rank
/// shares, a job id, and barriers (`nvfipc_barrier`).
///
/// Thread safety: getters and `nvfipc_barrier` may be called from any thread. The members of a
/// rank set must enter its barriers in the same order, and a waiting barrier occupies the
/// context's store (a TCP store sends one request at a time), delaying other threads' barriers
/// and store calls until it returns. `nvfipc_context_free` must not race with other calls on it.
#[derive(Clone)]
pub struct nvfipc_context {
    pub(crate) ctx: Arc<Context>,
    /// NUL-terminated copy of the job id for `nvfipc_context_job_id`.
    job_id: Arc<CString>,
}

impl Handle for nvfipc_context {}

impl nvfipc_context {
    fn new(ctx: Context) -> Self {
        let job_id = Arc::new(CString::new(ctx.job_id.clone()).unwrap_or_default());
        nvfipc_context {
            ctx: Arc::new(ctx),
            job_id,
        }
    }
}

/// Borrows the context behind a C pointer (the argument is always named `ctx`).
pub(crate) fn context_arg(ctx: *const nvfipc_context) -> Result<Arc<Context>> {
    Ok(handle_ref(ctx, "ctx")?.ctx)
}

/// Converts the four C rank numbers, naming the argument that is wrong.
fn rank_layout(
    rank: i64,
    world_size: i64,
    local_rank: i64,
    local_world_size: i64,
) -> Result<(usize, usize, usize, usize)> {
    let world = positive_arg(world_size, "world_size")?;
    if world > MAX_WORLD_SIZE {
        return Err(Error::invalid(format!(
            "argument `world_size` = {world} is above the limit of NVFIPC_MAX_WORLD_SIZE = \
             {MAX_WORLD_SIZE} ranks"
        )));
    }
    let local_world = positive_arg(local_world_size, "local_world_size")?;
    let rank = rank_arg(rank, world, "rank")?;
    let local_rank = rank_arg(local_rank, local_world, "local_rank")?;
    if local_world > world {
        return Err(Error::invalid(format!(
            "local_world_size {local_world} is larger than world_size {world}"
        )));
    }
    Ok((rank, world, local_rank, local_world))
}

/// Creates the context of rank `rank` of `world_size` (`local_rank` of `local_world_size` on
/// this node) over `store`. The store is shared, not consumed: the context keeps its own
/// reference, so the caller may free `store` at any time (the connection stays open until both
/// are freed). Every rank must create its context over the same store. `world_size` is at most
/// `NVFIPC_MAX_WORLD_SIZE`. On success `*out_ctx`
/// receives the context; free it with `nvfipc_context_free`. A rank other than 0 waits (bounded
/// by the store's timeout) until rank 0 has created its context. When another live process holds
/// this rank of this job (two jobs on one store without distinct `NVFIPC_JOB_TAG`s, or one rank
/// started twice), this fails with `NVFIPC_STATUS_INVALID_STATE` naming that process, and the
/// other process is refused as well (after its first barrier, or at `nvfipc_context_free`).
#[no_mangle]
pub extern "C" fn nvfipc_context_create(
    rank: i64,
    world_size: i64,
    local_rank: i64,
    local_world_size: i64,
    store: *const nvfipc_store,
    out_ctx: *mut *mut nvfipc_context,
) -> Status {
    ffi_call("nvfipc_context_create", || {
        let (rank, world_size, local_rank, local_world_size) =
            rank_layout(rank, world_size, local_rank, local_world_size)?;
        let store = handle_ref(store, "store")?;
        let out = out_ptr(out_ctx, "out_ctx")?;
        let ctx = Context::new(ContextOptions {
            rank,
            world_size,
            local_rank,
            local_world_size,
            store: store.store,
        })?;
        out.write(into_handle(nvfipc_context::new(ctx)))
    })
}

/// Creates the context of rank `rank` of `world_size` (all on this node) over the TCPStore at
/// `host`:`port`. With `host_store` true this rank first starts the store server here (on every
/// interface; port 0 picks a free one, see `nvfipc_context_hosted_port`), and keeps it running
/// at free until the other ranks are done (waiting at most `timeout_ms`, and at most 30 s).
/// `timeout_ms` (< 0: 300 s) bounds the connection and is the default timeout of the store and
/// of barriers. `world_size` is at most `NVFIPC_MAX_WORLD_SIZE`.
#[no_mangle]
pub extern "C" fn nvfipc_context_connect(
    rank: i64,
    world_size: i64,
    host: *const c_char,
    port: u16,
    host_store: bool,
    timeout_ms: i64,
    out_ctx: *mut *mut nvfipc_context,
) -> Status {
    ffi_call("nvfipc_context_connect", || {
        let (rank, world_size, _, _) = rank_layout(rank, world_size, rank, world_size)?;
        let host = c_str_arg(host, "host")?;
        let out = out_ptr(out_ctx, "out_ctx")?;
        if port == 0 && !host_store {
            return Err(Error::invalid(format!(
                "port 0 is only allowed when this rank hosts the store (connecting to {host})"
            )));
        }
        let timeout = timeout_arg(timeout_ms, DEFAULT_TIMEOUT);
        let ctx = Context::connect(rank, world_size, host, port, host_store, timeout)?;
        out.write(into_handle(nvfipc_context::new(ctx)))
    })
}

/// Creates the context from the launcher's environment: rank, world size and local rank from
/// Open MPI (`OMPI_COMM_WORLD_*`), `WORLD_RANK`/`WORLD_SIZE`, Slurm or torchrun (`RANK`,
/// `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`); the store at `NVFUSER_MASTER_ADDR`/`PORT` or
/// `MASTER_ADDR`/`MASTER_PORT`, hosted by local rank 0 of the master host (or an existing store
/// at `NVFIPC_STORE_ADDR`). The default timeout is `NVFIPC_TIMEOUT_MS`, else 300 s. The hosting
/// rank serves the store from `NVFIPC_STORE_THREADS` event loops (default 1), and at free waits
/// for the other ranks at most that timeout (and at most 30 s). The world size is at most
/// `NVFIPC_MAX_WORLD_SIZE`.
/// On success `*out_ctx` receives the context; free it with `nvfipc_context_free`.
#[no_mangle]
pub extern "C" fn nvfipc_context_from_env(out_ctx: *mut *mut nvfipc_context) -> Status {
    ffi_call("nvfipc_context_from_env", || {
        let out = out_ptr(out_ctx, "out_ctx")?;
        let ctx = Context::from_env(&EnvOptions::default())?;
        out.write(into_handle(nvfipc_context::new(ctx)))
    })
}

/// Writes this process's rank to `*out_rank`.
#[no_mangle]
pub extern "C" fn nvfipc_context_rank(ctx: *const nvfipc_context, out_rank: *mut i64) -> Status {
    ffi_call("nvfipc_context_rank", || {
        let value = context_arg(ctx)?.rank as i64;
        out_ptr(out_rank, "out_rank")?.write(value)
    })
}

/// Writes the number of ranks in the job to `*out_world_size`.
#[no_mangle]
pub extern "C" fn nvfipc_context_world_size(
    ctx: *const nvfipc_context,
    out_world_size: *mut i64,
) -> Status {
    ffi_call("nvfipc_context_world_size", || {
        let value = context_arg(ctx)?.world_size as i64;
        out_ptr(out_world_size, "out_world_size")?.write(value)
    })
}

/// Writes this process's rank among the ranks of its node to `*out_local_rank`.
#[no_mangle]
pub extern "C" fn nvfipc_context_local_rank(
    ctx: *const nvfipc_context,
    out_local_rank: *mut i64,
) -> Status {
    ffi_call("nvfipc_context_local_rank", || {
        let value = context_arg(ctx)?.local_rank as i64;
        out_ptr(out_local_rank, "out_local_rank")?.write(value)
    })
}

/// Writes the number of ranks on this node to `*out_local_world_size`.
#[no_mangle]
pub extern "C" fn nvfipc_context_local_world_size(
    ctx: *const nvfipc_context,
    out_local_world_size: *mut i64,
) -> Status {
    ffi_call("nvfipc_context_local_world_size", || {
        let value = context_arg(ctx)?.local_world_size as i64;
        out_ptr(out_local_world_size, "out_local_world_size")?.write(value)
    })
}

/// Writes the job id (agreed by all ranks; unique per run) to `*out_job_id`. The string belongs
/// to the context and stays valid until `nvfipc_context_free`.
#[no_mangle]
pub extern "C" fn nvfipc_context_job_id(
    ctx: *const nvfipc_context,
    out_job_id: *mut *const c_char,
) -> Status {
    ffi_call("nvfipc_context_job_id", || {
        // The CString lives in the boxed handle, which stays alive until the context is freed.
        let job_id = handle_ref(ctx, "ctx")?.job_id.as_ptr();
        out_ptr(out_job_id, "out_job_id")?.write(job_id)
    })
}

/// Writes the port of the store server this rank hosts to `*out_port`, or 0 when it hosts none.
#[no_mangle]
pub extern "C" fn nvfipc_context_hosted_port(
    ctx: *const nvfipc_context,
    out_port: *mut u16,
) -> Status {
    ffi_call("nvfipc_context_hosted_port", || {
        let port = context_arg(ctx)?.hosted_store_port().unwrap_or(0);
        out_ptr(out_port, "out_port")?.write(port)
    })
}

/// Writes a new reference to the context's store to `*out_store`, for direct key-value use (keys
/// under `nvfipc/` are the library's). Free it with `nvfipc_store_free`; the context keeps its own
/// reference.
#[no_mangle]
pub extern "C" fn nvfipc_context_store(
    ctx: *const nvfipc_context,
    out_store: *mut *mut nvfipc_store,
) -> Status {
    ffi_call("nvfipc_context_store", || {
        let ctx = context_arg(ctx)?;
        let out = out_ptr(out_store, "out_store")?;
        out.write(into_handle(nvfipc_store {
            store: ctx.store.clone(),
            tcp: None,
            callback: None,
        }))
    })
}

/// Closes and frees the context. This rank announces that it is done; a rank that hosts the
/// store first waits (bounded by the context's timeout, at most 30 s) until the other ranks have
/// closed or disconnected, so that nobody loses the store mid-operation, and reports
/// `NVFIPC_STATUS_TIMEOUT` if they did not (the context is freed in every case); so does a rank
/// whose process runs the server of a store through callbacks (c10d's rank 0, told where its
/// server listens by `nvfipc_store_set_server_address`), which goes when this process exits. It
/// gives `NVFIPC_STATUS_INVALID_STATE` when another process claimed this rank of this job while
/// it was open (see `nvfipc_context_create`). A rank that closes after the store's server hung
/// up (over a store through callbacks: stopped listening on this machine, see
/// `nvfipc_store_set_server_address`), or, over a store through callbacks that cannot tell,
/// after every other rank of the job or rank 0 has left, makes no store request: it announces
/// nothing, which nobody would read. Without the server's address a rank sees another leave only
/// through a cache that exchanged with it on this machine: one that never exchanged with rank 0
/// cannot tell that rank 0 (and a server in its process) has gone, so give the address wherever
/// a rank's process runs the server. NULL is a no-op; a second free gives
/// `NVFIPC_STATUS_INVALID_STATE`.
#[no_mangle]
pub extern "C" fn nvfipc_context_free(ctx: *mut nvfipc_context) -> Status {
    ffi_call("nvfipc_context_free", || {
        let Some(handle) = take_handle(ctx, "ctx")? else {
            return Ok(());
        };
        // When a call on another thread still holds it (a race the caller should not have), the
        // last reference closes it on drop.
        Arc::try_unwrap(handle.ctx).map_or(Ok(()), Context::close)
    })
}

#[cfg(test)]
mod tests;
