//! The library's own transports, handed to a cache by the layers above the exchange: host shared
//! memory at once, CUDA device memory on the first device request (so host-only users never load
//! the driver). The one place that names both the exchange and the concrete transports.

use crate::context::Context;
use crate::cuda::transport::CudaTransport;
use crate::error::Result;
use crate::exchange::{CacheConfig, HandleCache};
use crate::host::HostTransport;
use crate::transport::{MemKind, Transport, Transports};
use std::sync::Arc;

/// A cache for `cfg` with the library's own transports: its rank's host transport, and the CUDA
/// transport made on first use; both pass fds (host buffers, VMM and pool device buffers) through
/// the job's one fd transport.
pub fn cache(cfg: CacheConfig) -> Result<HandleCache> {
    let host = HostTransport::new(cfg.store.clone(), &cfg.job_id, cfg.rank)?;
    let fdpass = host.fdpass().clone();
    let mut set = Transports::of(vec![host as Arc<dyn Transport>])?;
    set.set_on_first_use(
        MemKind::Device,
        Box::new(move || {
            let t: Arc<dyn Transport> = CudaTransport::with_fdpass(None, Some(fdpass.clone()))?;
            Ok(t)
        }),
    );
    HandleCache::new(cfg, set)
}

/// A cache for `ctx` with the library's own transports; host buffers allocated from now on are
/// named after its job.
pub fn cache_from_context(ctx: &Context) -> Result<HandleCache> {
    crate::host::alloc::set_default_job(&ctx.job_id);
    cache(CacheConfig::from_context(ctx))
}

/// Written here rather than beside `CacheConfig`, so that the exchange does not depend on the
/// context.
impl CacheConfig {
    /// The configuration of `ctx` (its rank, world, store, job id and timeout), scope "".
    pub fn from_context(ctx: &Context) -> CacheConfig {
        CacheConfig {
            rank: ctx.rank,
            world_size: ctx.world_size,
            store: ctx.store.clone(),
            job_id: ctx.job_id.clone(),
            scope: String::new(),
            timeout: ctx.timeout(),
        }
    }
}
