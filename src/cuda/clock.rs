//! Where the cold path's time goes inside the driver, kind of call by kind of call, when asked
//! for (`Runtime::clock`, for `nvfipc bench`): off, a call pays one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The driver work a first exchange of fresh buffers does, in the order it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverCall {
    /// `cuIpcGetMemHandle`, or `cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`.
    Export,
    /// A peer's descriptors fetched from its fd responder.
    FdPass,
    /// `cuIpcOpenMemHandle`, or `cuMemImportFromShareableHandle`.
    Import,
    Reserve,
    Map,
    SetAccess,
    /// A released peer mapping closed (on the releaser's threads).
    Close,
}

/// Every kind of call, in order.
pub const DRIVER_CALLS: [DriverCall; 7] = [
    DriverCall::Export,
    DriverCall::FdPass,
    DriverCall::Import,
    DriverCall::Reserve,
    DriverCall::Map,
    DriverCall::SetAccess,
    DriverCall::Close,
];

impl DriverCall {
    pub fn name(self) -> &'static str {
        match self {
            DriverCall::Export => "export",
            DriverCall::FdPass => "fd_pass",
            DriverCall::Import => "import",
            DriverCall::Reserve => "reserve",
            DriverCall::Map => "map",
            DriverCall::SetAccess => "set_access",
            DriverCall::Close => "close",
        }
    }
}

/// Nanoseconds and calls per [`DriverCall`], summed over every thread of the process.
#[derive(Default)]
pub struct DriverClock {
    enabled: AtomicBool,
    nanos: [AtomicU64; DRIVER_CALLS.len()],
    calls: [AtomicU64; DRIVER_CALLS.len()],
}

impl DriverClock {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Runs `f`, charging its time to `call` when the clock is on.
    pub fn time<R>(&self, call: DriverCall, f: impl FnOnce() -> R) -> R {
        if !self.enabled.load(Ordering::Relaxed) {
            return f();
        }
        let start = Instant::now();
        let out = f();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos[call as usize].fetch_add(ns, Ordering::Relaxed);
        self.calls[call as usize].fetch_add(1, Ordering::Relaxed);
        out
    }

    /// (nanoseconds, calls) per kind of call since the last take, indexed like [`DRIVER_CALLS`].
    pub fn take(&self) -> [(u64, u64); DRIVER_CALLS.len()] {
        let mut out = [(0, 0); DRIVER_CALLS.len()];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (
                self.nanos[i].swap(0, Ordering::Relaxed),
                self.calls[i].swap(0, Ordering::Relaxed),
            );
        }
        out
    }
}
