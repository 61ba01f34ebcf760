//! Operating-system calls behind one door (as mio keeps `sys/`): the layers above use these
//! helpers and make no `libc` call of their own for them.
//!
//! - [`shm`]: POSIX shared-memory segments (`shm_open` + `mmap`), for node-local boards;
//! - [`memfd`]: anonymous shared files and their mappings, for host buffers passed by fd;
//! - [`mmap`]: the shared mapping of a descriptor's file, reserved ranges with files mapped at
//!   fixed places (host views), and freed heap memory handed back to the system;
//! - [`fd_passing`]: descriptors between processes (`SCM_RIGHTS`, pidfds, `PR_SET_PTRACER`,
//!   `SO_PEERCRED`), for the fd transport;
//! - [`cleanup`]: shm names and socket files removed at exit and on termination;
//! - [`sigbus`]: a SIGBUS guard for shared mappings another process may truncate (boards);
//! - [`wait`]: bounded waiting on values in shared memory (spin, yield, sleep, or block on a
//!   futex), paced by the usable cores and the node's runnable threads;
//! - [`process`]: the host name, whether a pid is alive, the boot clock and when this process
//!   started;
//! - [`launcher`]: the launcher's variables that place a process on its node;
//! - [`logfile`]: the log file, opened without blocking and without following links;
//! - [`net`]: the store's TCP sockets: resolution, the listener and its open-file limit,
//!   readiness, and whether a server of this machine still listens (a host's store);

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
