//! The checks between the ranks of a job: each rank publishes where it runs (host, kernel,
//! namespaces, /dev/shm, user) through the job's store, compares every peer's with its own, and
//! fetches a memfd from the next ranks on its kernel by each rung of the fd transport.

use super::peer::{fetch_by, marked_memfd, rung_checks, Meeting, RUNGS};
use super::{Check, Verdict};
use nvfuser_ipc::store::Store;
use nvfuser_ipc::tools::config::RankInfo;
use nvfuser_ipc::tools::fdpass::{FdId, FdPass, FdPassConfig, Rung};
use nvfuser_ipc::tools::node::{NodeIdentity, Reach};
use nvfuser_ipc::tools::os::ns_inode;
use nvfuser_ipc::Status;
use nvfuser_ipc::{Context, EnvOptions};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Peers a rank fetches a descriptor from (the next ones on its kernel, in ring order).
const FETCH_PEERS: usize = 8;

/// Each peer's outcome of one rung.
type PerPeer = Vec<(usize, Result<(), String>)>;

pub enum JobOutcome {
    /// No launcher variables, or a world of one: nothing to compare.
    NotAJob,
    Checked {
        rank: usize,
        world: usize,
        id: String,
        checks: Vec<Check>,
    },
    /// The job's context could not be made (the check says why).
    Failed(Check),
}

/// Where a rank runs, as published to its peers.
struct Place {
    node: NodeIdentity,
    net_ns: u64,
    mnt_ns: u64,
    uid: u32,
}

impl Place {
    fn local() -> Place {
        Place {
            node: NodeIdentity::local(),
            net_ns: ns_inode("net"),
            mnt_ns: ns_inode("mnt"),
            uid: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX),
        }
    }

    fn encode(&self) -> String {
        json!({"node": self.node.encode(), "net": self.net_ns, "mnt": self.mnt_ns, "uid": self.uid})
            .to_string()
    }

    fn decode(bytes: &[u8]) -> Option<Place> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        Some(Place {
            node: NodeIdentity::decode(v["node"].as_str()?)?,
            net_ns: v["net"].as_u64()?,
            mnt_ns: v["mnt"].as_u64()?,
            uid: u32::try_from(v["uid"].as_u64()?).ok()?,
        })
    }

    fn same_kernel(&self, other: &Place) -> bool {
        self.node.boot_id == other.node.boot_id
    }
}

/// How `peer` relates to this rank: a verdict, what differs, and what to change.
fn relate(me: &Place, peer: &Place) -> (Verdict, String, String) {
    if !me.same_kernel(peer) {
        return (
            Verdict::Pass,
            format!(
                "on another node ({:?}): handles are exchanged only between ranks of one node, \
                 the store and barriers span nodes",
                peer.node.host_name
            ),
            String::new(),
        );
    }
    if let Reach::Unmappable(why) = me.node.reach(&peer.node) {
        let mut detail = why;
        if me.net_ns != peer.net_ns {
            detail.push_str(&format!(
                "; also another network namespace (net:[{}] here, net:[{}] there)",
                me.net_ns, peer.net_ns
            ));
        }
        if me.node.pid_ns != peer.node.pid_ns {
            detail.push_str(&format!(
                "; also another PID namespace (pid:[{}] here, pid:[{}] there)",
                me.node.pid_ns, peer.node.pid_ns
            ));
        }
        return (
            Verdict::Fail,
            detail,
            "run the ranks of a node in one IPC namespace with one /dev/shm (containers: \
             --ipc=host)"
                .into(),
        );
    }
    if me.uid != peer.uid {
        return (
            Verdict::Fail,
            format!(
                "runs as uid {} and this rank as uid {}: the fd responder serves only its own \
                 user",
                peer.uid, me.uid
            ),
            "run every rank of the job as one user".into(),
        );
    }
    let mut differs = Vec::new();
    let mut fixes = Vec::new();
    if me.net_ns != peer.net_ns {
        differs.push(format!(
            "another network namespace (net:[{}] here, net:[{}] there): abstract sockets do not \
             reach it, the socket file must",
            me.net_ns, peer.net_ns
        ));
        fixes.push("--network=host, or NVFIPC_SOCKET_DIR on a directory both mount");
    }
    if me.node.pid_ns != peer.node.pid_ns {
        differs.push(format!(
            "another PID namespace (pid:[{}] here, pid:[{}] there): its death is seen only by \
             timeouts, and pidfd_getfd cannot reach it",
            me.node.pid_ns, peer.node.pid_ns
        ));
        fixes.push("--pid=host");
    }
    if me.mnt_ns != peer.mnt_ns {
        differs.push(format!(
            "another mount namespace (mnt:[{}] here, mnt:[{}] there): the socket directory must \
             be mounted into both",
            me.mnt_ns, peer.mnt_ns
        ));
    }
    if differs.is_empty() {
        (
            Verdict::Pass,
            "same host, kernel, IPC, network and PID namespaces, /dev/shm and user".into(),
            String::new(),
        )
    } else if me.net_ns != peer.net_ns || me.node.pid_ns != peer.node.pid_ns {
        (
            Verdict::Warn,
            format!(
                "same kernel, IPC namespace and /dev/shm, but {}",
                differs.join("; ")
            ),
            fixes.join(", "),
        )
    } else {
        (
            Verdict::Pass,
            format!(
                "same kernel, IPC namespace and /dev/shm; {}",
                differs.join("; ")
            ),
            String::new(),
        )
    }
}

fn ranks_text(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    if ranks.len() == 1 {
        format!("rank {}", list[0])
    } else {
        format!("ranks {}", list.join(", "))
    }
}

fn fail(name: &str, e: impl std::fmt::Display) -> Check {
    Check::new("job", name, Verdict::Fail).detail(e.to_string())
}

pub fn checks(timeout: Duration) -> JobOutcome {
    let ranks = match RankInfo::from_env() {
        Ok(r) if r.world_size >= 2 => r,
        Ok(_) => return JobOutcome::NotAJob,
        Err(e) if e.status == Status::NotFound => return JobOutcome::NotAJob,
        Err(e) => return JobOutcome::Failed(fail("launcher variables", e)),
    };
    let options = EnvOptions {
        timeout: Some(timeout),
        ..EnvOptions::default()
    };
    let ctx = match Context::from_env(&options) {
        Ok(c) => c,
        Err(e) => {
            return JobOutcome::Failed(
                fail("the job's store", e)
                    .fix("every rank must reach the store: check MASTER_ADDR/MASTER_PORT"),
            )
        }
    };
    let checks = match compare(&ctx, timeout) {
        Ok(c) => c,
        Err(e) => vec![fail("comparing the ranks", e)],
    };
    let (rank, world, id) = (ctx.rank, ranks.world_size, ctx.job_id.clone());
    let mut checks = checks;
    if let Err(e) = ctx.close() {
        checks.push(fail("closing the job's context", e));
    }
    JobOutcome::Checked {
        rank,
        world,
        id,
        checks,
    }
}

fn compare(ctx: &Context, timeout: Duration) -> nvfuser_ipc::Result<Vec<Check>> {
    let store: Arc<dyn Store> = ctx.store.clone();
    let (rank, world, job) = (ctx.rank, ctx.world_size, ctx.job_id.clone());
    let prefix = format!("nvfipc-doctor/{job}");
    let me = Place::local();
    store.set(&format!("{prefix}/place/{rank}"), me.encode().as_bytes())?;
    // This rank's descriptor for its peers to fetch.
    let fp = FdPass::new(
        store.clone(),
        &prefix,
        &job,
        rank,
        FdPassConfig::from_env()?,
    );
    let record = fp.start()?;
    let marker = format!("rank {rank} of job {job}");
    let id = fp.register(marked_memfd(&marker).map_err(nvfuser_ipc::Error::invalid)?)?;
    store.set(&format!("{prefix}/marker/{rank}"), marker.as_bytes())?;
    store.set(&format!("{prefix}/fd/{rank}"), &id.encode())?;

    let peers: Vec<usize> = (1..world).map(|i| (rank + i) % world).collect();
    let keys: Vec<String> = peers
        .iter()
        .map(|p| format!("{prefix}/place/{p}"))
        .collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let places = store.multi_get(&key_refs, timeout)?;
    let mut groups: BTreeMap<(u8, String, String), Vec<usize>> = BTreeMap::new();
    let mut same_kernel = Vec::new();
    for (&peer, bytes) in peers.iter().zip(&places) {
        let Some(place) = Place::decode(bytes) else {
            groups
                .entry((
                    2,
                    "published a place that does not parse".into(),
                    String::new(),
                ))
                .or_default()
                .push(peer);
            continue;
        };
        if me.same_kernel(&place) && same_kernel.len() < FETCH_PEERS {
            same_kernel.push(peer);
        }
        let (verdict, detail, fix) = relate(&me, &place);
        let order = match verdict {
            Verdict::Fail => 2,
            Verdict::Warn => 1,
            _ => 0,
        };
        groups.entry((order, detail, fix)).or_default().push(peer);
    }
    let mut checks: Vec<Check> = groups
        .into_iter()
        .rev()
        .map(|((order, detail, fix), ranks)| {
            let verdict = [Verdict::Pass, Verdict::Warn, Verdict::Fail][usize::from(order)];
            Check::new("job", ranks_text(&ranks), verdict)
                .detail(detail)
                .fix(fix)
        })
        .collect();

    // Fetch each same-kernel peer's descriptor by each rung alone.
    let per_rung = timeout.min(Duration::from_secs(5));
    let at = Meeting {
        store: &store,
        prefix: &prefix,
        job: &job,
    };
    let mut by_rung: Vec<(Rung, PerPeer)> = RUNGS.iter().map(|&r| (r, Vec::new())).collect();
    for &peer in &same_kernel {
        let id = store.get(&format!("{prefix}/fd/{peer}"), timeout)?;
        let id = FdId::decode(&id)
            .ok_or_else(|| nvfuser_ipc::Error::invalid(format!("rank {peer}'s fd id")))?;
        let marker =
            String::from_utf8_lossy(&store.get(&format!("{prefix}/marker/{peer}"), timeout)?)
                .into_owned();
        for (rung, outcomes) in by_rung.iter_mut() {
            let r = fetch_by(&at, (rank, peer), &id, *rung, &marker, per_rung);
            outcomes.push((peer, r));
        }
    }
    if !same_kernel.is_empty() {
        // Per rung: ok when every peer delivered; else the first failure, naming the peers.
        let outcomes: Vec<(Rung, Result<(), String>)> = by_rung
            .iter()
            .map(|(rung, per_peer)| {
                let failed: Vec<usize> = per_peer
                    .iter()
                    .filter(|(_, r)| r.is_err())
                    .map(|(p, _)| *p)
                    .collect();
                let first = per_peer.iter().find_map(|(_, r)| r.clone().err());
                (
                    *rung,
                    match first {
                        None => Ok(()),
                        Some(e) => Err(format!("from {}: {e}", ranks_text(&failed))),
                    },
                )
            })
            .collect();
        let who = format!("this rank, from {},", ranks_text(&same_kernel));
        let mut rungs = rung_checks(&record, &outcomes, &who);
        rungs.remove(0); // the responder line is the local probe's
                         // A peer that no rung reaches fails the job even when other peers are reachable.
        let unreachable: Vec<usize> = same_kernel
            .iter()
            .enumerate()
            .filter(|(i, _)| by_rung.iter().all(|(_, v)| v[*i].1.is_err()))
            .map(|(_, p)| *p)
            .collect();
        for c in &mut rungs {
            c.area = "job";
        }
        if !unreachable.is_empty() {
            rungs.push(
                fail(
                    "fd passing",
                    format!(
                        "no rung delivered a descriptor from {}",
                        ranks_text(&unreachable)
                    ),
                )
                .fix("see the rungs above: each names its gate"),
            );
        }
        checks.extend(rungs);
    }
    // Nobody drops its responder before every peer has fetched.
    ctx.barrier(None, Some(timeout))?;
    drop(fp);
    Ok(checks)
}
