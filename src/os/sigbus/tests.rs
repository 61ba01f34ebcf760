use super::*;
use crate::os::memfd::{create, SharedMapping};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// A mapped file without the size seals the library's own files carry, so that it can shrink.
fn create_mapped(name: &str, len: u64) -> crate::Result<SharedMapping> {
    let fd = create(name).unwrap();
    // SAFETY: `fd` is an open memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }, 0);
    SharedMapping::map(fd, len, name)
}

fn shrink(m: &SharedMapping, len: i64) {
    // SAFETY: the mapping's descriptor is open.
    assert_eq!(unsafe { libc::ftruncate(m.fd().as_raw_fd(), len) }, 0);
}

fn read(addr: u64) -> u64 {
    // SAFETY: tests read inside a mapping they hold; a page past the file's end faults.
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}

#[test]
fn a_truncated_guarded_range_reads_zeros_and_is_marked() {
    let m = create_mapped("sigbus-test", 3 * 4096).unwrap();
    // SAFETY: the mapping is 3 pages long.
    unsafe { std::ptr::write_volatile((m.addr() + 4096) as *mut u64, 7) };
    let g = guard(m.addr(), m.len());
    assert!(g.is_guarded() && !g.truncated());
    assert_eq!(read(m.addr() + 4096), 7);
    shrink(&m, 0);
    assert_eq!(read(m.addr() + 4096), 0, "zero pages after the fault");
    assert!(g.truncated());
    // Writes land in the private pages, and the whole range reads as they were left.
    // SAFETY: the range is mapped (now private zero pages).
    unsafe { std::ptr::write_volatile((m.addr() + 2 * 4096) as *mut u64, 9) };
    assert_eq!(read(m.addr() + 2 * 4096), 9);
    assert_eq!(read(m.addr()), 0);
    drop(g);
}

#[test]
fn a_file_shrunk_by_part_faults_only_past_its_end_and_marks_the_range() {
    let m = create_mapped("sigbus-test", 4 * 4096).unwrap();
    let g = guard(m.addr(), m.len());
    shrink(&m, 4096);
    assert_eq!(read(m.addr()), 0, "the first page is still the file's");
    assert!(!g.truncated());
    assert_eq!(read(m.addr() + 3 * 4096), 0);
    assert!(g.truncated());
}

#[test]
fn slots_are_reused_and_ranges_do_not_leak_into_each_other() {
    let a = guard(0x1000_0000, 4096);
    let b = guard(0x2000_0000, 4096);
    assert!(find(0x1000_0010).is_some() && find(0x2000_0ff8).is_some());
    assert!(find(0x1000_1000).is_none(), "one past the end");
    assert!(find(0x0fff_fff8).is_none(), "before the start");
    drop(a);
    assert!(find(0x1000_0010).is_none(), "released");
    let c = guard(0x1000_0000, 8192);
    assert!(c.is_guarded() && !c.truncated());
    assert!(
        find(0x1000_1000).is_some(),
        "the new range, not the old one"
    );
    drop((b, c));
}

const CHILD: &str = "NVFIPC_SIGBUS_CHILD";

/// What a child does, by `CHILD`: `unguarded` faults outside every guarded range; `chained`
/// does so after installing a handler of its own first (which exits 42); `killed` receives
/// SIGBUS from `kill`. Except in `chained`, the action found is the default one (the test
/// harness's own handler, Rust's stack-overflow check, is removed first).
#[test]
#[ignore = "run by the tests below as a child process"]
fn child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    if mode == "chained" {
        extern "C" fn exit42(_: libc::c_int) {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(42) };
        }
        // SAFETY: an all-zero action with a plain handler is valid; installed before ours.
        unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            a.sa_sigaction = exit42 as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(libc::SIGBUS, &a, std::ptr::null_mut());
        }
    } else {
        // SAFETY: a zeroed action is SIG_DFL with an empty mask.
        unsafe {
            let a: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &a, std::ptr::null_mut());
        }
    }
    let guarded = create_mapped("sigbus-guarded", 4096).unwrap();
    let _g = guard(guarded.addr(), guarded.len());
    if mode == "killed" {
        // SAFETY: sending a signal to this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGBUS) };
    } else {
        let other = create_mapped("sigbus-unguarded", 4096).unwrap();
        shrink(&other, 0);
        read(other.addr());
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    println!("child survived");
}

fn run_child(mode: &str) -> std::process::ExitStatus {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "os::sigbus::tests::child",
            "--nocapture",
        ])
        .env(CHILD, mode)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("child survived"),
        "{mode}: the child survived a SIGBUS it must not absorb"
    );
    out.status
}

#[test]
fn other_faults_still_kill_or_reach_the_previous_handler() {
    assert_eq!(run_child("unguarded").signal(), Some(libc::SIGBUS));
    assert_eq!(run_child("killed").signal(), Some(libc::SIGBUS));
    assert_eq!(run_child("chained").code(), Some(42));
}
