//! Operating-system calls behind one door (as mio keeps `sys/`): the layers above use these
//! helpers and make no `libc` call of their own for them.
//!
//! - [`shm`]: POSIX shared-memory segments (`shm_open` + `mmap`), for node-local boards;
//! - [`memfd`]: anonymous shared files and their mappings, for host buffers passed by fd;
//! - [`mmap`]: the shared mapping of a descriptor's file and its size, for both of those;
//! - [`fd_passing`]: descriptors between processes (`SCM_RIGHTS`, pidfds, `PR_SET_PTRACER`,
//!   `SO_PEERCRED`), for the fd transport;
//! - [`cleanup`]: shm names removed at exit and on termination, and reclaimed from dead processes;
//! - [`sigbus`]: a SIGBUS guard for shared mappings another process may truncate (boards);
//! - [`wait`]: bounded waiting on values in shared memory (spin, yield, sleep or block);
//! - [`futex`]: blocking on a word of a shared mapping until its writer wakes the waiters;
//! - [`cpu`]: usable cores and runnable threads, which decide how long a wait spins;
//! - [`process`]: the host name, whether a pid is alive, the boot clock and when this process
//!   started;
//! - [`launcher`]: the launcher's variables that place a process on its node;
//! - [`logfile`]: the log file, opened without blocking and without following links;
//! - [`listen`]: the store server's listening socket and the open-file limit;
//! - [`listening`]: whether a server of this machine still listens on a port (a host's store);
//! - [`mem`]: freed heap memory handed back to the system;
//! - [`net`]: name resolution, socket readiness and socket errno checks of the store;
//! - [`vrange`]: reserved address ranges with files mapped at fixed places (host views).

pub mod cleanup;
pub mod cpu;
pub mod fd_passing;
pub mod futex;
pub mod launcher;
pub mod listen;
pub mod listening;
pub mod logfile;
pub mod mem;
pub mod memfd;
pub mod mmap;
pub mod net;
pub mod process;
pub mod shm;
pub mod sigbus;
pub mod vrange;
pub mod wait;
