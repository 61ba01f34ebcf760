//! Internals that the `nvfipc` CLI and this crate's integration tests and examples need, behind
//! the cargo feature `tools`. Not part of the supported Rust API (the crate root, [`crate::store`]
//! and the C ABI in [`crate::ffi`] are): these items change with the internals they re-export.
//! Each group is named after the module it comes from and says which tool needs it.

/// Environment variables and limits that `nvfipc launch` and `serve` set or check.
pub mod config {
    pub use crate::config::{DEFAULT_MASTER_PORT, LAUNCH_ID_VAR, MAX_WORLD_SIZE};
    pub use crate::context::RankInfo;
}

/// The driver, as the CLI's device buffers, `nvfipc doctor`'s probes and the benchmarks' floors
/// call it (the thin driver-call wrappers themselves), and the driver-call counters that
/// `nvfipc bench` reports.
pub mod cuda {
    pub use crate::cuda::clock::DRIVER_CALLS;
    pub use crate::cuda::ipc::counters as ipc_counters;
    pub use crate::cuda::transport::CudaTransport;
    pub use crate::cuda::{driver, flush_releases, result, runtime};
}

/// The transport interface and the exchange's phases: `nvfipc bench` and `demo` build caches of
/// chosen transports, seed a store with records and time the phases; the examples read a board.
pub mod exchange {
    pub use crate::exchange::board::{fingerprint, PeerBoard};
    pub use crate::exchange::{LocalBuffer, PeerMapping, Transport, PHASES};
    pub use crate::transport::record::{self, flags, local_host, Record};
    pub use crate::transport::ExportedHandle;
}

/// The fd transport, which `nvfipc doctor` checks between two ranks and the tests attack, and the
/// uids whose boards the examples read.
pub mod fdpass {
    pub use crate::fdpass::diagnose::PtraceFacts;
    pub use crate::fdpass::registry::FD_ID_LEN;
    pub use crate::fdpass::{
        frame, record_key, FdId, FdPass, FdPassConfig, Gate, LocalIdentity, PeerRecord,
        PtracerState, Rung, TrustedUids,
    };
}

/// Host memory internals the tests check (segment names, live buffers, the default job) and the
/// host transport that `nvfipc bench` and `demo` build caches with.
pub mod host {
    pub use crate::host::alloc::{job_prefix, live_buffers, set_default_job};
    pub use crate::host::HostTransport;
}

/// Names of shared-memory segments and store keys, which the tests look for.
pub mod names {
    pub use crate::names::{fdpass_prefix, is_board_name, job_tag, CacheNames};
}

/// The store barrier the tests drive without a context.
pub mod barrier {
    pub use crate::barrier::{barrier, BarrierState, MemberSet};
}

/// The log sink, which tests install and read back.
pub mod logging {
    pub use crate::logging::{init, set_callback, STORE};
}

/// Node identity and reachability, which `nvfipc doctor` reports.
pub mod node {
    pub use crate::node::{host_name, NodeIdentity, Reach};
}

/// The OS facts `nvfipc doctor` reports, what `launch` confines ranks with, and the primitives
/// the benchmarks' floors measure (futexes, fd passing, shared memory).
pub mod os {
    pub use crate::os::fd_passing::{recv_with_fd, send_with_fd};
    pub use crate::os::memfd;
    pub use crate::os::net::fd_limits;
    pub use crate::os::process::{cgroup_dir, ns_inode};
    pub use crate::os::shm::{shm_free_and_total, unlink_name, ShmSegment};
    pub use crate::os::wait::{
        blocking_pace, futex_wait, futex_wake_all, usable_cores, wait_blocking, BlockingPace,
    };
}
