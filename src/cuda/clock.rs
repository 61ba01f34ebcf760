//! Where the cold path's time goes inside the driver, kind of call by kind of call, when asked
//! for (`Runtime::clock`, for `nvfipc bench`): off, a call pays one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

macro_rules! driver_calls {
    ($($(#[$doc:meta])* $call:ident => $name:literal,)*) => {
        /// The driver work a first exchange of fresh buffers does, in the order it happens.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum DriverCall {
            $($(#[$doc])* $call,)*
        }

        /// Every kind of call, in order.
        pub const DRIVER_CALLS: [DriverCall; DriverCall::Close as usize + 1] =
            [$(DriverCall::$call),*];

        impl DriverCall {
            pub fn name(self) -> &'static str {
                match self {
                    $(DriverCall::$call => $name,)*
                }
            }
        }
    };
}

driver_calls! {
    /// `cuIpcGetMemHandle`, or `cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`.
    Export => "export",
    /// A peer's descriptors fetched from its fd responder.
    FdPass => "fd_pass",
    /// `cuIpcOpenMemHandle`, or `cuMemImportFromShareableHandle` (`Close`: a released mapping closed).
    Import => "import",
    Reserve => "reserve",
    Map => "map",
    SetAccess => "set_access",
    Close => "close",
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
        let swap = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        std::array::from_fn(|i| (swap(&self.nanos[i]), swap(&self.calls[i])))
    }
}
