//! Which processes can map each other's memory, and whose pids this process can check: mapping
//! needs one kernel (boot id), one IPC namespace and one `/dev/shm` (containers on one machine
//! need `--ipc=host` and a shared `/dev/shm`); a pid means something only in its pid namespace on
//! its kernel. Every rank publishes its [`NodeIdentity`] when it joins a job (see `context`) and
//! compares a peer's with its own before it waits for anything node-local of that peer.

use crate::os::process::ns_inode;
pub use crate::os::process::{host_name, process_alive};
use once_cell::sync::Lazy;
use std::os::unix::fs::MetadataExt;

/// Where a process runs, as far as mapping memory and checking pids are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    pub host_name: String,
    /// The kernel's boot id (or the machine id): equal on one kernel, changes on reboot.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/ipc` (0 when unknown).
    pub ipc_ns: u64,
    /// Inode of `/proc/self/ns/pid` (0 when unknown).
    pub pid_ns: u64,
    /// `st_dev` and `st_ino` of `/dev/shm`: equal only for one and the same directory.
    pub shm_dev: u64,
    pub shm_ino: u64,
    pub pid: u32,
}

/// How a peer relates to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Its memory can be mapped here; `pids` says whether its pid can be checked from here.
    Mappable { pids: bool },
    /// Its memory cannot be mapped here; the message says why and what to do.
    Unmappable(String),
}

// process-wide: where this process runs, read from /proc once.
static LOCAL: Lazy<NodeIdentity> = Lazy::new(|| {
    let shm = std::fs::metadata("/dev/shm").ok();
    NodeIdentity {
        host_name: host_name(),
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .or_else(|_| std::fs::read_to_string("/etc/machine-id"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        ipc_ns: ns_inode("ipc"),
        pid_ns: ns_inode("pid"),
        shm_dev: shm.as_ref().map_or(0, |m| m.dev()),
        shm_ino: shm.as_ref().map_or(0, |m| m.ino()),
        pid: std::process::id(),
    }
});

impl NodeIdentity {
    /// This process's identity (computed once; the pid is the current one).
    pub fn local() -> NodeIdentity {
        NodeIdentity {
            pid: std::process::id(),
            ..LOCAL.clone()
        }
    }

    /// Bytes that are equal exactly for processes that can map each other's memory (the record's
    /// host identity is their hash).
    pub fn mapping_key(&self) -> Vec<u8> {
        let mut out = self.boot_id.clone().into_bytes();
        out.push(0);
        for n in [self.ipc_ns, self.shm_dev, self.shm_ino] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    }

    /// `key=value` fields separated by `;` (host names cannot contain `;`).
    pub fn encode(&self) -> String {
        format!(
            "node1;host={};boot={};ipc={};pidns={};shm={}:{};pid={}",
            self.host_name.replace(';', "_"),
            self.boot_id,
            self.ipc_ns,
            self.pid_ns,
            self.shm_dev,
            self.shm_ino,
            self.pid
        )
    }

    /// Parses [`encode`](Self::encode)'s output; `None` for anything else.
    pub fn decode(text: &str) -> Option<NodeIdentity> {
        let mut fields = text.split(';');
        if fields.next()? != "node1" {
            return None;
        }
        let mut id = NodeIdentity::default();
        for field in fields {
            let (k, v) = field.split_once('=')?;
            match k {
                "host" => id.host_name = v.to_string(),
                "boot" => id.boot_id = v.to_string(),
                "ipc" => id.ipc_ns = v.parse().ok()?,
                "pidns" => id.pid_ns = v.parse().ok()?,
                "shm" => {
                    let (d, i) = v.split_once(':')?;
                    id.shm_dev = d.parse().ok()?;
                    id.shm_ino = i.parse().ok()?;
                }
                "pid" => id.pid = v.parse().ok()?,
                _ => {}
            }
        }
        Some(id)
    }

    /// Can this process (`self`) map `peer`'s memory, and check its pid?
    pub fn reach(&self, peer: &NodeIdentity) -> Reach {
        let same_kernel = self.boot_id == peer.boot_id;
        let same_ipc = self.ipc_ns == peer.ipc_ns;
        let same_shm = self.shm_dev == peer.shm_dev && self.shm_ino == peer.shm_ino;
        if same_kernel && same_ipc && same_shm {
            return Reach::Mappable {
                pids: self.pid_ns == peer.pid_ns && self.pid_ns != 0,
            };
        }
        let mut missing = Vec::new();
        if !same_ipc {
            missing.push(format!(
                "IPC namespace (ipc:[{}] here, ipc:[{}] there)",
                self.ipc_ns, peer.ipc_ns
            ));
        }
        if !same_shm {
            missing.push(format!(
                "/dev/shm (device {} inode {} here, device {} inode {} there)",
                self.shm_dev, self.shm_ino, peer.shm_dev, peer.shm_ino
            ));
        }
        let message = if !same_kernel || self.host_name != peer.host_name {
            let kernel = if same_kernel {
                format!(
                    " (the same kernel, but it does not share this process's {}: a container \
                     or namespace of its own)",
                    missing.join(" or ")
                )
            } else {
                String::new()
            };
            format!(
                "is on another host ({:?}; this rank is on {:?}){kernel}: CUDA IPC and shared \
                 memory are node-local, so only ranks on one node can exchange handles",
                peer.host_name, self.host_name
            )
        } else {
            format!(
                "is on this host ({:?}) but in another container: it does not share this \
                 process's {}. CUDA IPC between containers needs a shared IPC namespace and a \
                 shared /dev/shm: run every container of the job with --ipc=host (or one \
                 shared IPC namespace) and the same /dev/shm",
                self.host_name,
                missing.join(" nor its ")
            )
        };
        Reach::Unmappable(message)
    }
}

/// A peer process whose liveness can be checked from here, when its pid means something here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerProcess {
    pub rank: usize,
    pub pid: u32,
    /// False when the peer runs in another pid namespace (its pid says nothing here).
    pub checkable: bool,
}

impl PeerProcess {
    /// True only when the pid is meaningful here and no such process exists any more.
    pub fn is_dead(&self) -> bool {
        self.checkable && self.pid != 0 && !process_alive(self.pid)
    }

    /// "peer rank R (pid P)" for messages, with ", which has exited" when it has.
    pub fn describe(&self) -> String {
        if self.is_dead() {
            format!(
                "peer rank {} (pid {}, which has exited)",
                self.rank, self.pid
            )
        } else if self.pid != 0 {
            format!("peer rank {} (pid {})", self.rank, self.pid)
        } else {
            format!("peer rank {}", self.rank)
        }
    }
}

#[cfg(test)]
mod tests;
