//! Operating-system calls behind one door (as mio keeps `sys/`): the layers above make no `libc`
//! call of their own for them. [`shm`] (named segments, for boards), [`memfd`] (anonymous files,
//! for host buffers), [`mmap`] (shared and fixed mappings), [`fd_passing`] (`SCM_RIGHTS`,
//! pidfds, `SO_PEERCRED`), [`cleanup`] (names removed at exit), [`sigbus`] (a guard for truncated
//! mappings), [`wait`] (bounded waits and futexes), [`process`] (host name, pids, clocks,
//! cgroups), [`launcher`] (local rank), [`logfile`], [`net`] (what `/proc` tells of a TCP server;
//! the store's own sockets are in the `nvfipc-store` crate).

pub mod cleanup;
pub mod fd_passing;
pub mod launcher;
pub mod logfile;
pub mod memfd;
pub mod mmap;
pub mod net;
pub mod process;
pub mod shm;
pub mod sigbus;
pub mod wait;

/// `rc` of a libc call that succeeded (non-negative), else the `errno` it left.
pub(crate) fn cvt<T: Default + PartialOrd>(rc: T) -> std::io::Result<T> {
    if rc < T::default() {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}
