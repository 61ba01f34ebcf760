//! The library's own transports, handed to a cache by the layers above the exchange (the C
//! layer, programs, tests): host shared memory at once, CUDA device memory on the first device
//! request (so host-only users never load the driver).
//!
//! This is the one place that names both the exchange and the concrete transports: the
//! exchange sees only the contract (`crate::transport`).

use crate::context::Context;
use crate::cuda::transport::CudaTransport;
use crate::error::Result;
use crate::exchange::{CacheConfig, HandleCache};
use crate::fdpass::{FdPass, FdPassConfig};
use crate::host::HostTransport;
use crate::transport::{MemKind, Transport, Transports};
use std::sync::Arc;

/// The host transport of `cfg`'s rank and job, and the CUDA transport made on first use; both
/// pass fds (host buffers, VMM and pool device buffers) through the job's one fd transport.
pub fn for_cache(cfg: &CacheConfig) -> Result<Transports> {
    let fdpass = FdPass::for_job(
        cfg.store.clone(),
        &crate::names::fdpass_prefix(&cfg.job_id),
        &crate::names::job_tag(&cfg.job_id),
        cfg.rank,
        FdPassConfig::from_env()?,
    );
    let host: Arc<dyn Transport> = HostTransport::with_fdpass(fdpass.clone())?;
    let mut set = Transports::of(vec![host])?;
    set.set_on_first_use(
        MemKind::Device,
        Box::new(move || {
            let t: Arc<dyn Transport> = CudaTransport::with_fdpass(None, Some(fdpass.clone()))?;
            Ok(t)
        }),
    );
    Ok(set)
}

/// A cache for `cfg` with the library's own transports.
pub fn cache(cfg: CacheConfig) -> Result<HandleCache> {
    let transports = for_cache(&cfg)?;
    HandleCache::new(cfg, transports)
}

/// A cache for `ctx` with the library's own transports. Also makes the context's job id the one
/// in the names of host buffers allocated from now on (`host::alloc`), as shown in
/// `/proc/<pid>/fd`.
pub fn cache_from_context(ctx: &Context) -> Result<HandleCache> {
    crate::host::alloc::set_default_job(ctx.job_id());
    cache(CacheConfig::from_context(ctx))
}

/// Written here rather than beside `CacheConfig`, so that the exchange does not depend on the
/// context.
impl CacheConfig {
    /// The configuration of `ctx` (its rank, world, store, job id and timeout), scope "".
    pub fn from_context(ctx: &Context) -> CacheConfig {
        CacheConfig {
            rank: ctx.rank(),
            world_size: ctx.world_size(),
            store: ctx.store().clone(),
            job_id: ctx.job_id().to_string(),
            scope: String::new(),
            timeout: ctx.timeout(),
        }
    }
}
