//! The log's C surface: the level and a callback that receives the lines instead of stderr
//! (nvFuser routes them into its own logger). The environment (`NVFIPC_DEBUG`,
//! `NVFIPC_DEBUG_SUBSYS`, `NVFIPC_DEBUG_FILE`) configures the same log without code.

use super::args::out_ptr;
use super::boundary::{ffi_call, to_c_message};
use crate::logging::{self, Level, Subsystem};
use crate::{Error, Status};
use log::LevelFilter;
use std::ffi::{c_char, c_void, CString};

/// Log level: nothing.
pub const NVFIPC_LOG_OFF: i32 = 0;
/// Log level: problems the library recovered from or is about to report (the default).
pub const NVFIPC_LOG_WARN: i32 = 1;
/// Log level: one line per store round trip, exchange step that moved records, open, release,
/// barrier and connection, with durations.
pub const NVFIPC_LOG_INFO: i32 = 2;
/// Log level: INFO plus waits as they begin and the keys of each store request.
pub const NVFIPC_LOG_DEBUG: i32 = 3;
/// Log level: everything, cached (free) exchanges included.
pub const NVFIPC_LOG_TRACE: i32 = 4;

/// Receives one log line: its level (`NVFIPC_LOG_WARN` .. `NVFIPC_LOG_TRACE`), its subsystem
/// ("store", "barrier", "exchange", "cuda", "host" or "server"), the whole line without a
/// newline (time, host:pid:tid, rank, level, subsystem, message) and the `user` pointer given to
/// `nvfipc_log_set_callback`. Both strings are valid only during the call. Called from any
/// thread, the library's own threads included, possibly concurrently: it must be thread-safe, must
/// not block for long, and must not call `nvfipc_log_set_callback`.
pub type nvfipc_log_fn = Option<
    unsafe extern "C" fn(
        level: i32,
        subsystem: *const c_char,
        line: *const c_char,
        user: *mut c_void,
    ),
>;

/// The C levels and the log's filters; the log's `Error` counts as `NVFIPC_LOG_WARN`.
const LEVELS: [(i32, LevelFilter); 5] = [
    (NVFIPC_LOG_OFF, LevelFilter::Off),
    (NVFIPC_LOG_WARN, LevelFilter::Warn),
    (NVFIPC_LOG_INFO, LevelFilter::Info),
    (NVFIPC_LOG_DEBUG, LevelFilter::Debug),
    (NVFIPC_LOG_TRACE, LevelFilter::Trace),
];

fn level_code(filter: LevelFilter) -> i32 {
    LEVELS
        .iter()
        .find(|(_, f)| *f == filter)
        .map_or(NVFIPC_LOG_WARN, |(code, _)| *code)
}

/// Sets the most verbose level written (`NVFIPC_LOG_OFF` .. `NVFIPC_LOG_TRACE`), overriding
/// `NVFIPC_DEBUG`, for the whole process. Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_log_set_level(level: i32) -> Status {
    ffi_call("nvfipc_log_set_level", || {
        let filter = LEVELS.iter().find(|(code, _)| *code == level);
        let (_, filter) = filter.ok_or_else(|| {
            Error::invalid(format!(
                "argument `level` is {level}; expected NVFIPC_LOG_OFF (0) .. NVFIPC_LOG_TRACE (4)"
            ))
        })?;
        logging::set_level(*filter);
        Ok(())
    })
}

/// Writes the level in force (set by `nvfipc_log_set_level` or read from `NVFIPC_DEBUG`) to
/// `*out_level`. Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_log_get_level(out_level: *mut i32) -> Status {
    ffi_call("nvfipc_log_get_level", || {
        let out = out_ptr(out_level, "out_level")?;
        logging::init();
        out.write(level_code(log::max_level()))
    })
}

/// Sends every log line to `callback` (with `user`) instead of stderr or `NVFIPC_DEBUG_FILE`;
/// NULL restores them. The level and subsystem filters still apply. A line being written while
/// the callback is replaced may still reach the previous one, so keep `user` valid until the
/// process's library threads are done (in practice: for the process's lifetime). Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_log_set_callback(callback: nvfipc_log_fn, user: *mut c_void) -> Status {
    ffi_call("nvfipc_log_set_callback", || {
        let Some(callback) = callback else {
            logging::set_callback(None);
            return Ok(());
        };
        // The pointer crosses threads as an integer: the caller promised a thread-safe callback
        // and a `user` valid while lines may arrive.
        let user = user as usize;
        logging::set_callback(Some(std::sync::Arc::new(
            move |level: Level, sub: Subsystem, line: &str| {
                let level = level_code(level.to_level_filter());
                let sub = CString::new(sub.name()).unwrap_or_default();
                let line = to_c_message(line);
                // SAFETY: `callback` is a function pointer the caller gave for this purpose; both
                // strings are NUL-terminated and outlive the call; `user` is passed back as given.
                unsafe { callback(level, sub.as_ptr(), line.as_ptr(), user as *mut c_void) };
            },
        )));
        Ok(())
    })
}
