//! The host's own gates: identity and namespaces, /dev/shm, the open-file limit, Yama and
//! seccomp.

use super::{Check, Verdict};
use nvfuser_ipc::tools::fdpass::PtraceFacts;
use nvfuser_ipc::tools::node::NodeIdentity;
use nvfuser_ipc::tools::os::fd_limits;
use nvfuser_ipc::tools::os::ns_inode;
use nvfuser_ipc::tools::os::{shm_free_and_total, ShmSegment};

const MIB: u64 = 1 << 20;

pub fn checks() -> Vec<Check> {
    vec![identity(), shm(), open_files(), ptrace(), seccomp()]
}

fn identity() -> Check {
    let me = NodeIdentity::local();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Check::new("host", "identity and namespaces", Verdict::Pass).detail(format!(
        "host {}, kernel {release}, boot id {}; ipc:[{}] net:[{}] pid:[{}] mnt:[{}]; /dev/shm \
         device {} inode {} (ranks that map each other's memory need the same kernel, IPC \
         namespace and /dev/shm)",
        me.host_name,
        me.boot_id,
        me.ipc_ns,
        ns_inode("net"),
        me.pid_ns,
        ns_inode("mnt"),
        me.shm_dev,
        me.shm_ino
    ))
}

fn shm() -> Check {
    let name = "/dev/shm";
    let Some((free, total)) = shm_free_and_total() else {
        return Check::new("host", name, Verdict::Fail)
            .detail("/dev/shm cannot be read (statvfs failed)")
            .fix("mount a tmpfs at /dev/shm (containers: --ipc=host, or --shm-size)");
    };
    let probe_name = format!("/nvfipc-doctor-{}", std::process::id());
    if let Err(e) = ShmSegment::create(&probe_name, MIB) {
        return Check::new("host", name, Verdict::Fail)
            .detail(format!("a 1 MiB segment cannot be created: {e}"))
            .fix(
                "the boards of the exchange live in /dev/shm: make it writable by this user, \
                 with free space (containers: --ipc=host and a shared /dev/shm)",
            );
    }
    let space = format!("{} MiB free of {} MiB", free / MIB, total / MIB);
    if free < 4 * MIB {
        Check::new("host", name, Verdict::Fail)
            .detail(format!("{space}: too little for the boards"))
            .fix("free space in /dev/shm (remove stale files) or enlarge it (--shm-size)")
    } else if total < 256 * MIB {
        Check::new("host", name, Verdict::Warn)
            .detail(format!(
                "{space}: enough for this library (only its boards, a few KiB per rank, live \
                 there; host buffers are anonymous memfds), small for PyTorch and NCCL"
            ))
            .fix("containers: --shm-size=1g or --ipc=host")
    } else {
        Check::new("host", name, Verdict::Pass).detail(format!("{space}; a segment was created"))
    }
}

fn open_files() -> Check {
    let name = "open-file limit";
    let Some((soft, hard)) = fd_limits() else {
        return Check::new("host", name, Verdict::CannotCheck).detail("getrlimit failed");
    };
    let show = |n: u64| {
        if n == u64::MAX {
            "unlimited".to_string()
        } else {
            n.to_string()
        }
    };
    let detail = format!("soft {}, hard {}", show(soft), show(hard));
    if soft >= 4096 {
        Check::new("host", name, Verdict::Pass).detail(detail)
    } else if soft < 256 {
        Check::new("host", name, Verdict::Fail)
            .detail(format!(
                "{detail}: too low for a responder, its peers' connections and VMM segments"
            ))
            .fix(format!(
                "ulimit -n {} (or LimitNOFILE=65536)",
                show(hard.max(4096))
            ))
    } else {
        Check::new("host", name, Verdict::Warn)
            .detail(format!(
                "{detail}: each exported VMM segment (expandable segments) keeps a descriptor \
                 open until it is freed, and each imported one briefly"
            ))
            .fix(format!(
                "ulimit -n {} (or LimitNOFILE=65536)",
                show(hard.max(4096))
            ))
    }
}

fn ptrace() -> Check {
    let name = "ptrace scope (Yama)";
    let facts = PtraceFacts::observe(std::process::id());
    let cap = if facts.cap_sys_ptrace {
        "this process has CAP_SYS_PTRACE"
    } else {
        "this process lacks CAP_SYS_PTRACE"
    };
    match facts.yama_scope {
        None | Some(0) => Check::new("host", name, Verdict::Pass).detail(format!(
            "{}: processes of one user may use pidfd_getfd on each other; {cap}",
            facts
                .yama_scope
                .map_or("no Yama".to_string(), |s| format!("ptrace_scope={s}"))
        )),
        Some(s) if facts.cap_sys_ptrace && s < 3 => Check::new("host", name, Verdict::Pass).detail(
            format!("ptrace_scope={s}; {cap}, so pidfd_getfd is allowed"),
        ),
        Some(s) => Check::new("host", name, Verdict::Warn)
            .detail(format!(
                "ptrace_scope={s} and {cap}: the pidfd rung of the fd transport cannot reach \
                 sibling ranks; the socket rungs (the default, tried first) need no ptrace \
                 rights"
            ))
            .fix(match s {
                1 => {
                    "nothing, unless the socket rungs fail too: then NVFIPC_FD_PTRACER=any, \
                      sysctl kernel.yama.ptrace_scope=0 or --cap-add SYS_PTRACE"
                }
                2 => "nothing, unless the socket rungs fail too: then --cap-add SYS_PTRACE",
                _ => "nothing, unless the socket rungs fail too (scope 3 forbids attaching)",
            }),
    }
}

fn seccomp() -> Check {
    let name = "seccomp";
    let facts = PtraceFacts::observe(std::process::id());
    match facts.seccomp {
        0 => Check::new("host", name, Verdict::Pass).detail("no seccomp filter"),
        2 if facts.cap_sys_ptrace => Check::new("host", name, Verdict::Pass).detail(
            "a filter is active (a container profile) and this process has CAP_SYS_PTRACE, \
             which Docker's default profile requires for pidfd_getfd; the fd probes below say \
             what it lets through",
        ),
        2 => Check::new("host", name, Verdict::Warn)
            .detail(
                "a filter is active (a container profile) and this process lacks \
                 CAP_SYS_PTRACE: Docker's default profile then refuses pidfd_getfd (the socket \
                 rungs still work); the fd probes below say what it lets through",
            )
            .fix("nothing, unless the socket rungs fail too: then --cap-add SYS_PTRACE"),
        mode => Check::new("host", name, Verdict::Fail)
            .detail(format!(
                "seccomp mode {mode} (strict): almost no system call is allowed"
            ))
            .fix("run without strict seccomp"),
    }
}
