//! Several nodes and containers, simulated with Linux namespaces on one machine.
//!
//! Node A is this machine as it is. A simulated node B runs its ranks under `unshare` with their
//! own mount namespace (a tmpfs of their own on /dev/shm), UTS namespace (another host name) and
//! IPC namespace, and, where the machine permits, their own network namespace joined to this one
//! by a veth pair, so that every rank reaches the store over a real non-loopback address. A
//! "container" is the same without another host name. The ranks are this test binary, re-run as
//! the ignored `node_rank` test. Where the machine forbids namespaces the tests print SKIPPED.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use nvfuser_ipc::store::server::StoreServer;
use nvfuser_ipc::ChannelKey;
use nvfuser_ipc::Status;
use nvfuser_ipc::{Context, EnvOptions};
use nvfuser_ipc::{HandleCache, MemKind, Request};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "NVFIPC_NODE_ROLE";
const T: Duration = Duration::from_secs(20);
const T_MS: &str = "20000";

const CLEARED: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "NVFUSER_MASTER_ADDR",
    "NVFUSER_MASTER_PORT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NVFIPC_STORE_ADDR",
    "NVFIPC_JOB_TAG",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
];

// ------------------------------------------------------------------------------------------------
// Simulated nodes
// ------------------------------------------------------------------------------------------------

/// Can this machine give a process its own mount, UTS and IPC namespaces?
fn namespaces_permitted() -> bool {
    Command::new("unshare")
        .args(["-m", "-u", "-i", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

macro_rules! require_namespaces {
    ($test:expr) => {
        if !namespaces_permitted() {
            println!(
                "SKIPPED {}: this machine forbids mount/UTS/IPC namespaces (unshare -m -u -i \
                 failed; run as root or allow unprivileged user namespaces)",
                $test
            );
            return;
        }
    };
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace joined to this one by a veth pair; deleted on drop.
struct Net {
    name: String,
    host_addr: String,
}

impl Net {
    /// `None` (with a note) where the machine does not permit it.
    fn create(slot: u32) -> Option<Net> {
        let id = std::process::id() % 10_000;
        let name = format!("nvfipc-{id}-{slot}");
        let (a, b) = (format!("nva{id}x{slot}"), format!("nvb{id}x{slot}"));
        let subnet = format!("10.{}.{}", 200 + slot, id % 250);
        let net = Net {
            name: name.clone(),
            host_addr: format!("{subnet}.1"),
        };
        let ok = ip(&["netns", "add", &name])
            && ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
            && ip(&["link", "set", &b, "netns", &name])
            && ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &a])
            && ip(&["link", "set", &a, "up"])
            && ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"])
            && ip(&[
                "netns",
                "exec",
                &name,
                "ip",
                "addr",
                "add",
                &format!("{subnet}.2/24"),
                "dev",
                &b,
            ])
            && ip(&["netns", "exec", &name, "ip", "link", "set", &b, "up"]);
        if !ok {
            println!(
                "note: no network namespace with a veth pair here (ip netns/veth failed); \
                 node B shares this network and the store is reached over loopback"
            );
            let _ = ip(&["link", "del", &a]);
            return None;
        }
        Some(net)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it the other end.
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A simulated node: a process holding its own mount namespace (a tmpfs of `shm_mb` MiB on
/// /dev/shm), IPC and UTS namespaces (another host name when given), and the network namespace of
/// `net` when given. Ranks enter its namespaces with `nsenter`. Killed on drop.
struct SimNode {
    holder: Child,
}

impl SimNode {
    fn start(host_name: Option<&str>, net: Option<&Net>, shm_mb: u32) -> SimNode {
        let mut c = match net {
            Some(n) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &n.name, "unshare"]);
                c
            }
            None => Command::new("unshare"),
        };
        let rename = host_name.map_or(String::new(), |h| format!("hostname {h} && "));
        c.args([
            "-m",
            "-u",
            "-i",
            "sh",
            "-c",
            &format!(
                "mount -t tmpfs -o size={shm_mb}m nvfipc-node /dev/shm && {rename}echo ready \
                 && exec sleep 600"
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let mut holder = c.spawn().expect("start a simulated node");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the simulated node did not start");
        SimNode { holder }
    }

    fn b(net: Option<&Net>) -> SimNode {
        SimNode::start(Some("nvfipc-node-b"), net, 64)
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Where a rank runs: this machine as it is, a simulated node, or this machine in a pid
/// namespace of its own (a container sharing the IPC namespace and /dev/shm but not the pids).
#[derive(Clone, Copy)]
enum Node<'a> {
    A,
    Sim(&'a SimNode),
    OwnPids,
}

fn spawn(node: Node, role: &str, rank: usize, world: usize, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let test_args = [
        "node_rank",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ];
    let mut cmd = match node {
        Node::A => Command::new(&exe),
        Node::OwnPids => {
            let mut c = Command::new("unshare");
            c.args(["-p", "-f", "--"]).arg(&exe);
            c
        }
        Node::Sim(sim) => {
            let mut c = Command::new("nsenter");
            c.args([
                "-t",
                &sim.holder.id().to_string(),
                "-m",
                "-u",
                "-i",
                "-n",
                "--",
            ])
            .arg(&exe);
            c
        }
    };
    cmd.args(test_args)
        .env(ROLE, role)
        .env("WORLD_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("NVFIPC_TIMEOUT_MS", T_MS)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in CLEARED {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{:?}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A store in this process, listening on every interface; returns it and the address the
/// ranks use (the veth address when there is one).
fn store(net: Option<&Net>) -> (StoreServer, String) {
    let server = StoreServer::bind("", 0).unwrap();
    let host = net.map_or("127.0.0.1".to_string(), |n| n.host_addr.clone());
    let addr = format!("{host}:{}", server.port());
    (server, addr)
}

/// The address this machine would send from (no packet is sent), if it is not loopback.
fn outbound_addr() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

fn client_at(addr: &str) -> TcpStore {
    let (host, port) = addr.rsplit_once(':').unwrap();
    TcpStore::connect(host, port.parse().unwrap(), &ConnectOptions::default()).unwrap()
}

fn client(port: u16) -> TcpStore {
    TcpStore::connect("127.0.0.1", port, &ConnectOptions::default()).unwrap()
}

// ------------------------------------------------------------------------------------------------
// Ranks
// ------------------------------------------------------------------------------------------------

fn pattern(rank: usize, bytes: usize) -> Vec<u8> {
    (0..bytes).map(|i| (i * 7 + rank * 31) as u8).collect()
}

/// Same-node pair exchange and data through the host transport, with the buddy `rank ^ 1`.
fn same_node_transfer(ctx: &Context, cache: &HandleCache) {
    let rank = ctx.rank;
    let buddy = rank ^ 1;
    let bytes = 4096usize;
    let send = nvfuser_ipc::host_alloc(bytes as u64).unwrap();
    let recv = nvfuser_ipc::host_alloc(bytes as u64).unwrap();
    send.write(0, &pattern(rank, bytes)).unwrap();
    let reqs = [
        Request::send(buddy, "near", send.addr(), bytes as u64, MemKind::Host),
        Request::recv(buddy, "near", recv.addr(), bytes as u64, MemKind::Host),
    ];
    for round in 0..3 {
        cache.exchange_handles(&reqs).unwrap();
        let hs = cache.get(&reqs[0]).unwrap();
        let hr = cache.get(&reqs[1]).unwrap();
        nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
        nvfuser_ipc::host_p2p_recv_post(&hr, bytes as u64, T).unwrap();
        nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
        let mut got = vec![0u8; bytes];
        recv.read(0, &mut got).unwrap();
        assert_eq!(got, pattern(buddy, bytes), "rank {rank} round {round}");
    }
    let stats = cache.stats();
    assert_eq!(stats.exchanges, 3, "{stats:?}");
}

/// A request to `far` (not mappable from here) must fail promptly, publishing nothing.
fn refused_far_request(ctx: &Context, cache: &HandleCache, far: usize, needles: &[&str]) {
    let rank = ctx.rank;
    let buf = nvfuser_ipc::host_alloc(256).unwrap();
    let reqs = [
        Request::send(far, "far", buf.addr(), 256, MemKind::Host),
        Request::recv(far, "far", buf.addr(), 256, MemKind::Host),
    ];
    let start = Instant::now();
    let err = cache.exchange_handles(&reqs).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.status, Status::Unsupported, "{err}");
    for needle in needles {
        assert!(err.message.contains(needle), "{needle:?} not in: {err}");
    }
    assert!(err.message.contains(&format!("peer rank {far}")), "{err}");
    assert!(took < T / 2, "refused only after {took:?}: {err}");
    // Nothing of the attempt stays in the store.
    let key = ChannelKey::of(rank, &reqs[0], 0).record_key(cache.names(), rank, 1);
    assert!(!ctx.store.check(&[&key]).unwrap(), "{key} was left");
    println!("rank {rank}: refused in {} ms: {err}", took.as_millis());
}

/// One rank of a test above; does nothing unless one of them started it.
#[test]
#[ignore = "a rank process, started by the tests of this file"]
fn node_rank() {
    let role = std::env::var(ROLE).expect("started without a role");
    if role == "alloc-big" {
        // /dev/shm here is a tmpfs of 8 MiB: host buffers do not live there, so 32 MiB work,
        // every page of them (a sparse file in a full tmpfs would SIGBUS here).
        let buf = nvfuser_ipc::host_alloc(32 << 20).unwrap();
        let page = vec![0x5au8; 4096];
        for off in (0..buf.len()).step_by(4096) {
            buf.write(off, &page).unwrap();
        }
        let mut back = vec![0u8; 4096];
        buf.read(buf.len() - 4096, &mut back).unwrap();
        assert_eq!(back, page);
        // What memory cannot hold is an error before anything is touched.
        let err = nvfuser_ipc::host_alloc(1 << 50).unwrap_err();
        assert!(err.message.contains("bytes requested"), "{err}");
        println!("refused: {err}");
        return;
    }
    if role == "race" {
        // Two jobs start at once; each rank reports the first claim error it meets.
        let job = std::env::var("NVFIPC_T_JOB").unwrap();
        let rank = std::env::var("WORLD_RANK").unwrap();
        let ctx = Context::from_env(&EnvOptions::default());
        let control = client_at(&std::env::var("NVFIPC_STORE_ADDR").unwrap());
        control
            .set(&format!("test/started/{job}/{rank}"), b"1")
            .unwrap();
        control.get("test/go", T).unwrap();
        let result = ctx.and_then(|ctx| {
            ctx.barrier(None, None)?;
            ctx.close()
        });
        match result {
            Ok(()) => println!("job {job} rank {rank}: completed"),
            Err(e) => println!("job {job} rank {rank}: refused: {e}"),
        }
        return;
    }
    let ctx = match Context::from_env(&EnvOptions::default()) {
        Ok(ctx) => ctx,
        Err(e) if role == "dup-late" => {
            assert_eq!(e.status, Status::InvalidState, "{e}");
            assert!(e.message.contains("already claimed"), "{e}");
            println!("refused: {e}");
            return;
        }
        Err(e) => panic!("context: {e}"),
    };
    let rank = ctx.rank;
    match role.as_str() {
        "two-nodes" => {
            // Ranks 0, 1 on node A, ranks 2, 3 on node B.
            ctx.barrier(None, None).unwrap();
            let cache = nvfuser_ipc::cache_from_context(&ctx).unwrap();
            same_node_transfer(&ctx, &cache);
            refused_far_request(
                &ctx,
                &cache,
                (rank + 2) % 4,
                &["another host", "node-local"],
            );
            ctx.barrier(None, None).unwrap();
            // A barrier over one rank of each node.
            if [1, 2].contains(&rank) {
                ctx.barrier(Some(&[1, 2]), None).unwrap();
            }
            cache.try_close().unwrap();
            ctx.close().unwrap();
            println!("rank {rank}: done");
        }
        "container" => {
            let cache = nvfuser_ipc::cache_from_context(&ctx).unwrap();
            refused_far_request(&ctx, &cache, 1 - rank, &["--ipc=host", "/dev/shm"]);
            ctx.barrier(None, None).unwrap();
            cache.try_close().unwrap();
            ctx.close().unwrap();
            println!("rank {rank}: done");
        }
        "dup-hold" => {
            ctx.barrier(None, None).unwrap();
            ctx.store.set(&format!("test/held/{rank}"), b"1").unwrap();
            ctx.store.get("test/go", T).unwrap();
            let err = ctx.close().unwrap_err();
            assert_eq!(err.status, Status::InvalidState, "{err}");
            assert!(err.message.contains("also claimed"), "{err}");
            println!("refused at close: {err}");
        }
        "own-pids" => {
            // Rank 0 is late to everything, so rank 1 waits long enough for liveness checks,
            // which must not take rank 0 (whose pid means nothing in rank 1's namespace, and the
            // other way round) for dead.
            let late = || {
                if rank == 0 {
                    std::thread::sleep(Duration::from_millis(1500));
                }
            };
            let cache = nvfuser_ipc::cache_from_context(&ctx).unwrap();
            let bytes = 4096usize;
            let send = nvfuser_ipc::host_alloc(bytes as u64).unwrap();
            let recv = nvfuser_ipc::host_alloc(bytes as u64).unwrap();
            send.write(0, &pattern(rank, bytes)).unwrap();
            let reqs = [
                Request::send(1 - rank, "p", send.addr(), bytes as u64, MemKind::Host),
                Request::recv(1 - rank, "p", recv.addr(), bytes as u64, MemKind::Host),
            ];
            late();
            cache.exchange_handles(&reqs).unwrap();
            let (hs, hr) = (cache.get(&reqs[0]).unwrap(), cache.get(&reqs[1]).unwrap());
            assert!(!hs.peer.checkable, "{:?}", hs.peer);
            late();
            nvfuser_ipc::host_p2p_send_post(&hs).unwrap();
            nvfuser_ipc::host_p2p_recv_post(&hr, bytes as u64, T).unwrap();
            nvfuser_ipc::host_p2p_send_wait(&hs, T).unwrap();
            let mut got = vec![0u8; bytes];
            recv.read(0, &mut got).unwrap();
            assert_eq!(got, pattern(1 - rank, bytes));
            ctx.barrier(None, None).unwrap();
            cache.try_close().unwrap();
            ctx.close().unwrap();
            println!("rank {rank}: done");
        }
        "linger" => {
            ctx.store.set("test/lingering", b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        "plain" => {
            ctx.barrier(None, None).unwrap();
            ctx.close().unwrap();
            println!("rank {rank}: done");
        }
        "elect" => {
            println!("hosts={}", ctx.hosted_store_port().is_some());
            ctx.barrier(None, None).unwrap();
            let start = Instant::now();
            ctx.close().unwrap();
            println!("closed in {} ms", start.elapsed().as_millis());
        }
        "dead-peer" => {
            let cache = nvfuser_ipc::cache_from_context(&ctx).unwrap();
            let bytes = 1024u64;
            let buf = nvfuser_ipc::host_alloc(bytes).unwrap();
            let reqs = [
                Request::send(1 - rank, "t", buf.addr(), bytes, MemKind::Host),
                Request::recv(1 - rank, "t", buf.addr(), bytes, MemKind::Host),
            ];
            cache.exchange_handles(&reqs).unwrap();
            if rank == 1 {
                ctx.store.set("test/victim", b"1").unwrap();
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            ctx.store.get("test/killed", T).unwrap();
            let start = Instant::now();
            let h = cache.get(&reqs[1]).unwrap();
            let err = nvfuser_ipc::host_p2p_recv_post(&h, bytes, T).unwrap_err();
            assert!(start.elapsed() < T / 2, "{err}");
            let h = cache.get(&reqs[0]).unwrap();
            nvfuser_ipc::host_p2p_send_post(&h).unwrap();
            let err2 = nvfuser_ipc::host_p2p_send_wait(&h, T).unwrap_err();
            assert!(start.elapsed() < T / 2, "{err2}");
            for e in [&err, &err2] {
                assert!(e.message.contains("has exited"), "{e}");
                assert!(e.message.contains("peer rank 1 (pid"), "{e}");
            }
            println!("rank 0: {err}\nrank 0: {err2}");
            println!("job={}", ctx.job_id);
        }
        other => panic!("unknown role {other}"),
    }
}

// ------------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------------

fn store_env(addr: &str, local: usize, local_size: usize) -> Vec<(&'static str, String)> {
    vec![
        ("NVFIPC_STORE_ADDR", addr.to_string()),
        ("WORLD_LOCAL_RANK", local.to_string()),
        ("WORLD_LOCAL_SIZE", local_size.to_string()),
    ]
}

#[test]
fn two_nodes_of_two_ranks_exchange_locally_and_refuse_across_nodes_at_once() {
    require_namespaces!("two_nodes_of_two_ranks_exchange_locally_and_refuse_across_nodes_at_once");
    let net = Net::create(1);
    let (_server, addr) = store(net.as_ref());
    let b = SimNode::b(net.as_ref());
    let ranks: Vec<Child> = (0..4)
        .map(|r| {
            let node = if r < 2 { Node::A } else { Node::Sim(&b) };
            spawn(node, "two-nodes", r, 4, &store_env(&addr, r % 2, 2))
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(finish).collect();
    let all: Vec<String> = outs.iter().map(text).collect();
    for (r, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "rank {r} failed; all ranks: {all:#?}");
        assert!(all[r].contains("refused in"), "rank {r}: {all:#?}");
    }
}

#[test]
fn a_container_without_a_shared_ipc_namespace_and_dev_shm_is_named() {
    require_namespaces!("a_container_without_a_shared_ipc_namespace_and_dev_shm_is_named");
    let (_server, addr) = store(None);
    let container = SimNode::start(None, None, 64);
    let ranks = [
        spawn(Node::A, "container", 0, 2, &store_env(&addr, 0, 1)),
        spawn(
            Node::Sim(&container),
            "container",
            1,
            2,
            &store_env(&addr, 0, 1),
        ),
    ];
    for (r, child) in ranks.into_iter().enumerate() {
        let out = finish(child);
        assert!(out.status.success(), "rank {r}: {}", text(&out));
    }
}

#[test]
fn two_jobs_without_a_tag_on_one_store_are_both_refused() {
    let (server, addr) = store(None);
    let control = client(server.port());
    let env = |r: usize| store_env(&addr, r, 2);
    let first: Vec<Child> = (0..2)
        .map(|r| spawn(Node::A, "dup-hold", r, 2, &env(r)))
        .collect();
    control.wait(&["test/held/0", "test/held/1"], T).unwrap();
    let second: Vec<Child> = (0..2)
        .map(|r| spawn(Node::A, "dup-late", r, 2, &env(r)))
        .collect();
    let second: Vec<Output> = second.into_iter().map(finish).collect();
    control.set("test/go", b"1").unwrap();
    for (r, out) in first.into_iter().map(finish).enumerate() {
        assert!(out.status.success(), "first job, rank {r}: {}", text(&out));
        assert!(text(&out).contains("refused at close"), "{}", text(&out));
    }
    for (r, out) in second.iter().enumerate() {
        assert!(out.status.success(), "second job, rank {r}: {}", text(out));
        assert!(text(out).contains("refused:"), "{}", text(out));
    }
}

#[test]
fn two_jobs_without_a_tag_started_together_are_all_refused() {
    let (server, addr) = store(None);
    let control = client(server.port());
    let mut ranks = Vec::new();
    for job in ["a", "b"] {
        for r in 0..2 {
            let mut env = store_env(&addr, r, 2);
            env.push(("NVFIPC_T_JOB", job.to_string()));
            ranks.push(spawn(Node::A, "race", r, 2, &env));
        }
    }
    // Every rank has tried to claim its place before any of them goes on.
    let started: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|j| (0..2).map(move |r| format!("test/started/{j}/{r}")))
        .collect();
    let started: Vec<&str> = started.iter().map(String::as_str).collect();
    control.wait(&started, T).unwrap();
    control.set("test/go", b"1").unwrap();
    let outs: Vec<String> = ranks.into_iter().map(|c| text(&finish(c))).collect();
    for o in &outs {
        // Whichever process won a rank's slot, neither job runs with ranks of the other.
        assert!(
            o.contains("refused:") && o.contains("claimed") && !o.contains("completed"),
            "{outs:#?}"
        );
    }
}

#[test]
fn a_killed_job_does_not_capture_the_next_one_on_the_store() {
    let (server, addr) = store(None);
    let control = client(server.port());
    // Only rank 0 of the first job comes, and it is killed.
    let mut dead = spawn(Node::A, "linger", 0, 2, &store_env(&addr, 0, 2));
    control.wait(&["test/lingering"], T).unwrap();
    dead.kill().unwrap();
    dead.wait().unwrap();
    // The next job, untagged on the same store, with its rank 1 first.
    let r1 = spawn(Node::A, "plain", 1, 2, &store_env(&addr, 1, 2));
    std::thread::sleep(Duration::from_millis(200));
    let r0 = spawn(Node::A, "plain", 0, 2, &store_env(&addr, 0, 2));
    let outs: Vec<Output> = [r0, r1].into_iter().map(finish).collect();
    for o in &outs {
        assert!(o.status.success(), "{outs:#?}");
        assert!(text(o).contains(": done"), "{outs:#?}");
    }
}

#[test]
fn peers_in_another_pid_namespace_are_not_taken_for_dead() {
    if !Command::new("unshare")
        .args(["-p", "-f", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        println!(
            "SKIPPED peers_in_another_pid_namespace_are_not_taken_for_dead: this machine \
             forbids pid namespaces (unshare -p -f failed)"
        );
        return;
    }
    let (_server, addr) = store(None);
    let ranks = [
        spawn(Node::A, "own-pids", 0, 2, &store_env(&addr, 0, 2)),
        spawn(Node::OwnPids, "own-pids", 1, 2, &store_env(&addr, 1, 2)),
    ];
    let outs: Vec<Output> = ranks.into_iter().map(finish).collect();
    for o in &outs {
        assert!(o.status.success(), "{outs:#?}");
        assert!(text(o).contains(": done"), "{outs:#?}");
    }
}

#[test]
fn exactly_one_of_two_nodes_sharing_the_network_hosts_the_store() {
    require_namespaces!("exactly_one_of_two_nodes_sharing_the_network_hosts_the_store");
    // Both nodes share this network, so both see MASTER_ADDR (an address of this machine that
    // is not loopback: the job spans nodes) as their own, and both are local rank 0.
    let net = Net::create(2);
    let Some(addr) = net
        .as_ref()
        .map(|n| n.host_addr.clone())
        .or_else(outbound_addr)
    else {
        println!(
            "SKIPPED exactly_one_of_two_nodes_sharing_the_network_hosts_the_store: no \
                  non-loopback address on this machine"
        );
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = vec![
        ("MASTER_ADDR", addr),
        ("MASTER_PORT", port.to_string()),
        ("WORLD_LOCAL_RANK", "0".to_string()),
        ("WORLD_LOCAL_SIZE", "1".to_string()),
    ];
    let b = SimNode::b(None);
    let ranks = [
        spawn(Node::A, "elect", 0, 2, &env),
        spawn(Node::Sim(&b), "elect", 1, 2, &env),
    ];
    let outs: Vec<Output> = ranks.into_iter().map(finish).collect();
    assert!(outs.iter().all(|o| o.status.success()), "{outs:#?}");
    let outs: Vec<String> = outs.iter().map(text).collect();
    let hosts = outs.iter().filter(|o| o.contains("hosts=true")).count();
    assert_eq!(hosts, 1, "{outs:?}");
    for o in &outs {
        let ms: u64 = o
            .split("closed in ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{o}"));
        // Far below the 30 s host linger: the host did not wait for a rank that never came.
        assert!(ms < 15_000, "{o}");
    }
}

#[test]
fn transfer_waits_name_a_dead_peer_at_once() {
    let (server, addr) = store(None);
    let control = client(server.port());
    let env = |r: usize| store_env(&addr, r, 2);
    let survivor = spawn(Node::A, "dead-peer", 0, 2, &env(0));
    let mut victim = spawn(Node::A, "dead-peer", 1, 2, &env(1));
    control.wait(&["test/victim"], T).unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();
    control.set("test/killed", b"1").unwrap();
    let out = finish(survivor);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("pid {}", victim.id())),
        "{}",
        text(&out)
    );
    // The survivor reclaimed the dead rank's board, slab and buffers; its own went when it ended.
    let job = text(&out)
        .split("job=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", text(&out)));
    let prefix = nvfuser_ipc::tools::host::job_prefix(&job);
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn host_buffers_do_not_depend_on_the_size_of_dev_shm() {
    require_namespaces!("host_buffers_do_not_depend_on_the_size_of_dev_shm");
    let small = SimNode::start(None, None, 8);
    let out = finish(spawn(Node::Sim(&small), "alloc-big", 0, 1, &[]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("refused:"), "{}", text(&out));
}
