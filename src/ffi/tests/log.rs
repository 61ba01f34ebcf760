use crate::error::Status;
use crate::ffi::log::*;
use crate::logging;
use std::ffi::CStr;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

static LINES: Mutex<Vec<(i32, String, String, usize)>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect(
    level: i32,
    subsystem: *const c_char,
    line: *const c_char,
    user: *mut c_void,
) {
    // SAFETY: the library passes NUL-terminated strings valid during the call.
    let (sub, line) = unsafe {
        (
            CStr::from_ptr(subsystem).to_string_lossy().into_owned(),
            CStr::from_ptr(line).to_string_lossy().into_owned(),
        )
    };
    LINES
        .lock()
        .unwrap()
        .push((level, sub, line, user as usize));
}

#[test]
fn levels_and_the_callback_round_trip() {
    assert_eq!(nvfipc_log_set_level(7), Status::InvalidArgument);
    assert_eq!(
        nvfipc_log_get_level(std::ptr::null_mut()),
        Status::InvalidArgument
    );
    assert_eq!(nvfipc_log_set_level(NVFIPC_LOG_INFO), Status::Ok);
    let mut level = -1;
    assert_eq!(nvfipc_log_get_level(&mut level), Status::Ok);
    assert_eq!(level, NVFIPC_LOG_INFO);
    assert_eq!(
        nvfipc_log_set_callback(Some(collect), 0x5eed as *mut c_void),
        Status::Ok
    );
    log::info!(target: logging::BARRIER, "unit-test marker {}", 17);
    log::debug!(target: logging::BARRIER, "unit-test hidden");
    assert_eq!(
        nvfipc_log_set_callback(None, std::ptr::null_mut()),
        Status::Ok
    );
    log::info!(target: logging::BARRIER, "unit-test after");
    assert_eq!(nvfipc_log_set_level(NVFIPC_LOG_WARN), Status::Ok);
    let lines = LINES.lock().unwrap();
    let mine: Vec<_> = lines.iter().filter(|l| l.2.contains("unit-test")).collect();
    assert_eq!(mine.len(), 1, "{lines:?}");
    let (lvl, sub, line, user) = mine[0];
    assert_eq!(
        (*lvl, sub.as_str(), *user),
        (NVFIPC_LOG_INFO, "barrier", 0x5eed)
    );
    assert!(
        line.ends_with("NVFIPC INFO barrier: unit-test marker 17"),
        "{line}"
    );
}
