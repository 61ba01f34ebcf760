//! `nvfipc demo` and `nvfipc bench --quick` as users run them, over the host transport. No
//! timing is asserted: only that the runs finish, verify their data and report what they did.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const NVFIPC: &str = env!("CARGO_BIN_EXE_nvfipc");
const LIMIT: Duration = Duration::from_secs(60);

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn collect(mut source: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = source.read_to_string(&mut text);
        text
    })
}

/// Kills the whole process group (the launcher and its ranks) of a child started with
/// `process_group(0)`.
fn kill_group(child: &Child) {
    // SAFETY: kill(2) takes no pointers; the child is not reaped yet, so its pid still names
    // its process group.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

fn nvfipc(args: &[&str], env: &[(&str, &str)]) -> Finished {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(NVFIPC)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn nvfipc");
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > LIMIT {
            kill_group(&child);
            let _ = child.wait();
            panic!("nvfipc {args:?} did not finish within {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Finished {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The row of `rank` in the demo table, split into cells (two or more spaces apart).
fn row<'a>(stdout: &'a str, rank: &str) -> Vec<&'a str> {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(rank))
        .unwrap_or_else(|| panic!("no row for rank {rank} in:\n{stdout}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn demo_ring(ranks: usize) {
    let n = ranks.to_string();
    let run = nvfipc(
        &[
            "demo",
            "--ranks",
            &n,
            "--iters",
            "5",
            "--bytes",
            "4099",
            "--transport",
            "host",
        ],
        &[],
    );
    assert!(
        run.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    assert!(
        out.contains(&format!("{ranks} ranks in a ring, host (shared memory)")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "OK: {ranks} ranks verified 5 transfers of 4099 bytes each"
        )),
        "{out}"
    );
    for r in 0..ranks {
        let cells = row(out, &r.to_string());
        // rank, cold, warm, swap, verified bytes, store round trips, hits/misses, opens
        assert_eq!(cells.len(), 8, "{cells:?}");
        assert_eq!(cells[4], (5 * 4099).to_string(), "{cells:?}");
        // Cold (2 channels miss: 1 multi_set + 1 multi_get) and the swap step (the send
        // channel and, on the neighbour, the receive channel miss) each cost at most two
        // round trips; the three cached steps cost none.
        let trips: u64 = cells[5].parse().unwrap();
        assert!((2..=4).contains(&trips), "{cells:?}");
        // Five steps of two channels: cold misses both, the swap step misses both (this
        // rank's send and its predecessor's), the three cached steps hit both.
        assert_eq!(cells[6], "6/4", "{cells:?}");
    }
    let all = row(out, "all");
    assert_eq!(all[4], (ranks as u64 * 5 * 4099).to_string(), "{all:?}");
    // A legend explains every column of the table.
    for column in [
        "rank",
        "cold exchange",
        "warm exchange (median)",
        "swap exchange",
        "verified bytes",
        "store round trips",
        "hits/misses",
        "opens",
    ] {
        assert!(
            out.contains(&format!("\n{column}: ")),
            "no legend for {column:?}: {out}"
        );
    }
}

#[test]
fn demo_two_ranks_host() {
    demo_ring(2);
}

#[test]
fn demo_four_ranks_host() {
    demo_ring(4);
}

#[test]
fn demo_rejects_bad_options_and_unavailable_transports() {
    let run = nvfipc(&["demo", "--ranks", "1"], &[]);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("'--ranks <N>': must be at least 2"),
        "{}",
        run.stderr
    );
    let run = nvfipc(&["demo", "--transport", "gpu"], &[]);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    // Device without a driver (this machine, CI): a clear error and a non-zero exit.
    let probe = nvfipc(&["demo", "--transport", "device", "--iters", "1"], &[]);
    if !probe.status.success() {
        assert_eq!(probe.status.code(), Some(1), "{}", probe.stderr);
        assert!(
            probe.stderr.contains("--transport device") && probe.stderr.contains("CUDA"),
            "{}",
            probe.stderr
        );
        // The cause once, not again as the status's name.
        assert!(
            probe.stderr.matches("CUDA driver not available").count() <= 1,
            "{}",
            probe.stderr
        );
    }
}

#[test]
fn demo_fails_clearly_when_the_ranks_fail() {
    // No rank can allocate its buffers: each must say why, and the demo must exit non-zero.
    let run = nvfipc(
        &[
            "demo",
            "--ranks",
            "2",
            "--iters",
            "2",
            "--bytes",
            "18446744073709551615",
            "--transport",
            "host",
            "--timeout-ms",
            "1000",
        ],
        &[],
    );
    assert!(!run.status.success(), "{}", run.stdout);
    assert!(run.stderr.contains("nvfipc demo: FAILED"), "{}", run.stderr);
    assert!(
        run.stderr.contains("] nvfipc demo: rank ")
            && run.stderr.contains("bytes of host shared memory"),
        "{}",
        run.stderr
    );
}

#[test]
fn bench_quick_smoke() {
    let dir = std::env::temp_dir().join(format!("nvfipc-bench-smoke-{}", std::process::id()));
    let json = dir.join("bench.json");
    let run = nvfipc(
        &[
            "bench",
            "--quick",
            "--transport",
            "host",
            "--no-torch",
            "--json",
            json.to_str().unwrap(),
            "--svg-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        run.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    for needle in [
        "== Ring exchange, host (shared memory)",
        "== Store server",
        "== Barrier over the world",
        "== Targets",
        "torch rows skipped (--no-torch)",
        "pool p50",
        "pool at W=2 vs seed baseline",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    for protocol in ["ours", "seed", "floor"] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(protocol)),
            "no {protocol} row in:\n{out}"
        );
    }
    let text = std::fs::read_to_string(&json).unwrap();
    for key in [
        "\"exchange\"",
        "\"ours.cold\"",
        "\"seed.warm\"",
        "\"ours.pool\"",
        "\"seed.pool\"",
        "\"store\"",
        "\"barrier\"",
        "\"targets\"",
    ] {
        assert!(text.contains(key), "missing {key} in {text}");
    }
    for name in ["exchange", "store", "barrier"] {
        let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{name}.svg: {svg}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The symmetric scenario runs the group sizes of `--ranks`, checks every peer's data, and writes
/// its table, phase lines, JSON rows and plot.
#[test]
fn bench_symmetric_smoke() {
    let dir = std::env::temp_dir().join(format!("nvfipc-bench-symm-{}", std::process::id()));
    let json = dir.join("bench.json");
    let run = nvfipc(
        &[
            "bench",
            "--quick",
            "--scenario",
            "symmetric",
            "--transport",
            "host",
            "--ranks",
            "2,3",
            "--json",
            json.to_str().unwrap(),
            "--svg-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        run.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    for needle in [
        "== Symmetric rendezvous, host (shared memory)",
        "symmetric at W=3, where a fresh rendezvous goes",
        "symmetric at W=3, where the first contact goes (median over ranks, the slowest rank in brackets): setup",
        "symmetric at W=3, where the cache hit goes",
        "symmetric rendezvous at W=3: per-peer cost vs W=2",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    assert!(!out.contains("== Ring exchange"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| matches!(l.split_whitespace().next(), Some("2" | "3")))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    let text = std::fs::read_to_string(&json).unwrap();
    for key in [
        "\"symmetric\"",
        "\"per_peer_ns\"",
        "\"first_phases\"",
        "\"world\": 3",
    ] {
        assert!(text.contains(key), "missing {key} in {text}");
    }
    let svg = std::fs::read_to_string(dir.join("symmetric.svg")).unwrap();
    assert!(svg.contains("<polyline"), "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}
