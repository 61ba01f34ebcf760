//! The `nvfipc` binary as users run it: `serve`, `launch`, help and usage errors.

use nvfuser_ipc::store::client::{ConnectOptions, TcpStore};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const NVFIPC: &str = env!("CARGO_BIN_EXE_nvfipc");

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn collect(mut source: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = source.read_to_string(&mut text);
        text
    })
}

/// Waits for `child` at most `limit`; kills it and fails the test past that.
fn wait_bounded(mut child: Child, limit: Duration) -> Finished {
    let start = Instant::now();
    // A caller may already read stdout itself.
    let out = child.stdout.take().map(collect);
    let err = child.stderr.take().map(collect);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nvfipc did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    Finished {
        status,
        stdout: out.map(|h| h.join().unwrap()).unwrap_or_default(),
        stderr: err.map(|h| h.join().unwrap()).unwrap_or_default(),
        elapsed,
    }
}

fn nvfipc(args: &[&str], limit: Duration) -> Finished {
    let child = Command::new(NVFIPC)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvfipc");
    wait_bounded(child, limit)
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn help_and_usage_errors() {
    for args in [&["--help"][..], &["help"], &["-h"]] {
        let run = nvfipc(args, LIMIT);
        assert_eq!(run.status.code(), Some(0), "{args:?}");
        assert!(run.stdout.contains("Usage:"), "{}", run.stdout);
        assert!(run.stdout.contains("nvfipc launch -n N"), "{}", run.stdout);
    }
    for (args, needle) in [
        (&[][..], "missing command"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (
            &["serve", "--port", "x"],
            "invalid value 'x' for '--port <P>'",
        ),
        (&["serve", "--bogus"], "unexpected argument '--bogus'"),
        // Named as the usage line names it.
        (&["launch", "--", "true"], "provided:\n  -n <N>"),
        (&["launch", "-n", "2"], "<CMD>..."),
        (&["barrier-test"], "--rounds <R>"),
        (&["demo", "--ranks", "1"], "must be at least 2"),
        (&["completions", "tcsh"], "invalid value 'tcsh'"),
    ] {
        let run = nvfipc(args, LIMIT);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("nvfipc --help"), "{}", run.stderr);
    }
}

const COMMANDS: [&str; 6] = ["serve", "launch", "demo", "bench", "barrier-test", "doctor"];

/// Every command prints its own usage for `--help` and `-h` (even with other options before
/// them), exits 0 and runs nothing.
#[test]
fn every_command_has_its_own_help() {
    for command in COMMANDS.iter().chain(&["demo-rank", "bench-rank"]) {
        for flag in ["--help", "-h"] {
            let run = nvfipc(&[command, flag], LIMIT);
            assert_eq!(
                run.status.code(),
                Some(0),
                "{command} {flag}: {}",
                run.stderr
            );
            assert!(
                run.stdout.starts_with("Usage:\n  nvfipc "),
                "{}",
                run.stdout
            );
            if *command != "demo-rank" && *command != "bench-rank" {
                assert!(
                    run.stdout.contains(&format!("nvfipc {command} ")),
                    "{command}: {}",
                    run.stdout
                );
            }
        }
    }
    let run = nvfipc(&["launch", "-n", "2", "--help"], LIMIT);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("nvfipc launch -n N"), "{}", run.stdout);
    // After the command, --help belongs to the command.
    let run = nvfipc(
        &[
            "launch",
            "-n",
            "1",
            "--",
            "sh",
            "-c",
            "echo \"$0\"",
            "--help",
        ],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("[rank 0] --help"), "{}", run.stdout);
}

/// `nvfipc --help` shows each command's usage exactly as that command's own help does.
#[test]
fn top_help_agrees_with_each_command() {
    let top = nvfipc(&["--help"], LIMIT).stdout;
    for command in COMMANDS.iter().chain(&["completions"]) {
        let help = nvfipc(&[command, "--help"], LIMIT).stdout;
        let usage = help
            .strip_prefix("Usage:\n")
            .and_then(|rest| rest.split("\n\n").next())
            .unwrap_or_else(|| panic!("{command}: no usage section in {help}"));
        assert!(
            top.contains(&format!("{usage}\n")),
            "nvfipc --help disagrees with nvfipc {command} --help:\n{usage}\n---\n{top}"
        );
    }
}

/// `nvfipc completions SHELL` prints a script that offers every shown command and none of the
/// hidden ones.
#[test]
fn completions_offer_the_shown_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let run = nvfipc(&["completions", shell], LIMIT);
        assert_eq!(run.status.code(), Some(0), "{shell}: {}", run.stderr);
        for command in COMMANDS {
            assert!(run.stdout.contains(command), "{shell} lacks {command}");
        }
        assert!(run.stdout.contains("kill-grace-ms"), "{shell}");
        for hidden in ["demo-rank", "bench-rank", "doctor-peer"] {
            assert!(!run.stdout.contains(hidden), "{shell} offers {hidden}");
        }
    }
}

/// The lines under "Examples:" of `nvfipc --help` run as printed, with no nvfipc on PATH.
#[test]
fn help_examples_run_as_printed() {
    let help = nvfipc(&["--help"], LIMIT).stdout;
    let examples: Vec<&str> = help
        .split("Examples:\n")
        .nth(1)
        .expect("an Examples section")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(examples.len() >= 3, "{examples:?}");
    for example in examples {
        let words: Vec<&str> = example.split_whitespace().collect();
        assert_eq!(words[0], "nvfipc", "{example}");
        let mut cmd = Command::new(NVFIPC);
        cmd.args(&words[1..])
            .env("PATH", "/usr/bin:/bin")
            .env_remove("NVFIPC_PYTHON")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if words[1] == "serve" {
            // Serves until stopped: it must say where, then stop on SIGTERM.
            let mut child = cmd.spawn().expect("spawn");
            let mut first = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut first)
                .unwrap();
            assert!(first.starts_with("listening on "), "{example}: {first:?}");
            let run = stop_with(child, libc::SIGTERM);
            assert_eq!(run.status.code(), Some(0), "{example}: {}", run.stderr);
            continue;
        }
        let run = wait_bounded(cmd.spawn().expect("spawn"), Duration::from_secs(120));
        assert_eq!(
            run.status.code(),
            Some(0),
            "{example}:\n{}\n{}",
            run.stdout,
            run.stderr
        );
    }
}

/// Every option any command's help names is in the README's CLI section.
#[test]
fn readme_cli_section_lists_every_option() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("## CLI")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a CLI section in README.md");
    for command in COMMANDS {
        let help = nvfipc(&[command, "--help"], LIMIT).stdout;
        let options = help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
        for option in options.filter(|w| w.starts_with("--") && w.len() > 2) {
            assert!(
                section.contains(option),
                "README's CLI section lacks {option} of nvfipc {command}"
            );
        }
        assert!(section.contains(&format!("nvfipc {command}")), "{command}");
    }
}

/// Starts `nvfipc serve` on an ephemeral port; returns the child and the port it printed.
fn start_server() -> (Child, u16, thread::JoinHandle<Vec<String>>) {
    let mut child = Command::new(NVFIPC)
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvfipc serve");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let rest = thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(first)) = lines.next() {
            let _ = tx.send(first);
        }
        lines.map_while(|l| l.ok()).collect::<Vec<_>>()
    });
    let line = rx
        .recv_timeout(LIMIT)
        .expect("serve printed no line in time");
    let addr = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let (host, port) = addr.rsplit_once(':').unwrap();
    assert_eq!(host, "127.0.0.1");
    let port: u16 = port.parse().unwrap();
    assert_ne!(port, 0);
    (child, port, rest)
}

fn stop_with(child: Child, signal: libc::c_int) -> Finished {
    // SAFETY: kill(2) takes no pointers; the child is not reaped yet, so its pid is still ours.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
    wait_bounded(child, LIMIT)
}

#[test]
fn serve_prints_its_address_serves_and_stops_on_sigterm() {
    let (child, port, rest) = start_server();
    let store = TcpStore::connect(
        "127.0.0.1",
        port,
        &ConnectOptions::with_timeout(Duration::from_secs(10)),
    )
    .unwrap();
    store.set("greeting", b"hello").unwrap();
    assert_eq!(
        store.get("greeting", Duration::from_secs(5)).unwrap(),
        b"hello"
    );
    drop(store);
    let run = stop_with(child, libc::SIGTERM);
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    // Exactly one line on stdout.
    assert!(rest.join().unwrap().is_empty());
}

#[test]
fn serve_stops_on_sigint_with_a_client_connected() {
    let (child, port, _rest) = start_server();
    let store = TcpStore::connect(
        "127.0.0.1",
        port,
        &ConnectOptions::with_timeout(Duration::from_secs(10)),
    )
    .unwrap();
    store.set("k", b"v").unwrap();
    let run = stop_with(child, libc::SIGINT);
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert!(store.get("k", Duration::from_secs(2)).is_err());
}

#[test]
fn serve_reports_a_busy_port() {
    let (child, port, _rest) = start_server();
    let run = nvfipc(
        &["serve", "--host", "127.0.0.1", "--port", &port.to_string()],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains(&port.to_string()), "{}", run.stderr);
    stop_with(child, libc::SIGTERM);
}

#[test]
fn launch_sets_the_environment_and_prefixes_output() {
    let script = r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_RANK $WORLD_LOCAL_RANK $WORLD_LOCAL_SIZE $MASTER_ADDR $MASTER_PORT $NVFIPC_STORE_ADDR ${OMPI_COMM_WORLD_RANK:-unset}"; printf 'to stderr\nno newline' >&2"#;
    let child = Command::new(NVFIPC)
        .args(["launch", "-n", "3", "--", "sh", "-c", script])
        .env("OMPI_COMM_WORLD_RANK", "9")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = wait_bounded(child, LIMIT);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    let mut lines: Vec<&str> = run.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    let port = lines[0].split(' ').nth(10).unwrap();
    assert!(port.parse::<u16>().unwrap() > 0);
    for (r, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            format!("[rank {r}] {r} 3 {r} 3 {r} {r} 3 127.0.0.1 {port} 127.0.0.1:{port} unset")
        );
        assert!(
            run.stderr.contains(&format!("[rank {r}] to stderr\n")),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains(&format!("[rank {r}] no newline\n")),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn launch_propagates_the_first_failure_and_stops_the_rest() {
    let run = nvfipc(
        &[
            "launch",
            "-n",
            "4",
            "--",
            "sh",
            "-c",
            r#"if [ "$RANK" = 2 ]; then sleep 0.2; exit 7; fi; sleep 60"#,
        ],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(7), "{}", run.stderr);
    assert!(run.stderr.contains("rank 2 failed"), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn launch_reports_a_signal_as_128_plus_its_number() {
    let run = nvfipc(
        &[
            "launch",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            r#"if [ "$RANK" = 0 ]; then kill -9 $$; fi; sleep 60"#,
        ],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(137), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn launch_kills_ranks_that_ignore_sigterm_after_the_grace_period() {
    let run = nvfipc(
        &[
            "launch",
            "-n",
            "3",
            "--kill-grace-ms",
            "300",
            "--",
            "sh",
            "-c",
            r#"trap '' TERM; if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60"#,
        ],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn launch_stops_everything_on_sigterm() {
    let child = Command::new(NVFIPC)
        .args(["launch", "-n", "2", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    let run = stop_with(child, libc::SIGTERM);
    assert_eq!(
        run.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        run.stderr
    );
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn launch_of_a_missing_command_exits_127() {
    let run = nvfipc(&["launch", "-n", "2", "--", "/nonexistent/cmd"], LIMIT);
    assert_eq!(run.status.code(), Some(127), "{}", run.stderr);
    assert!(run.stderr.contains("cannot start rank 0"), "{}", run.stderr);
}

/// A word for a command line that no process outside this test run has: `base` followed by this
/// process's pid (two runs of these tests on one machine never see each other's ranks).
fn marker(base: &str) -> String {
    format!("{base}{}", std::process::id())
}

/// Pids of the processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let words: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            if words.iter().any(|w| w == marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// Fails unless no process whose command line has the word `marker` is left within a second.
fn assert_none_left(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for pid in &left {
                // SAFETY: kill(2) takes no pointers.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            }
            panic!("ranks left running: {left:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `program args` under a soft and hard RLIMIT_NPROC of `nproc`, in its own process group. As
/// root (whom the kernel exempts from that limit) it runs as uid and gid 65534.
fn under_process_limit(program: &str, args: &[&str], nproc: u64) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and calls only setrlimit, geteuid,
    // setgroups, setgid and setuid (async-signal-safe), on a struct of its own stack.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: nproc,
                rlim_max: nproc,
            };
            if libc::setrlimit(libc::RLIMIT_NPROC, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::geteuid() == 0
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Rank counts the library cannot take, or that this machine cannot start, are usage errors
/// (status 2 with the reason), found before anything starts.
#[test]
fn absurd_rank_counts_are_usage_errors() {
    for args in [
        &["launch", "-n", "99999999999", "--", "true"][..],
        &["launch", "-n", "200000", "--", "true"],
        &["demo", "--ranks", "131073"],
        &["demo", "--ranks", "99999999999999999999999"],
    ] {
        let done = nvfipc(args, Duration::from_secs(20));
        assert_eq!(done.status.code(), Some(2), "{args:?}: {}", done.stderr);
        assert!(
            done.stderr
                .contains("must be at most 131072 ranks (NVFIPC_MAX_WORLD_SIZE)"),
            "{args:?}: {}",
            done.stderr
        );
    }
    // Within the library's limit, beyond this user's process limit.
    for args in [
        &["launch", "-n", "100", "--", "true"][..],
        &["demo", "--ranks", "100"],
    ] {
        let child = under_process_limit(NVFIPC, args, 50).spawn().unwrap();
        let done = wait_bounded(child, Duration::from_secs(20));
        assert_eq!(done.status.code(), Some(2), "{args:?}: {}", done.stderr);
        assert!(
            done.stderr
                .contains("100 ranks need about 300 processes and threads")
                && done.stderr.contains("ulimit -u 50"),
            "{args:?}: {}",
            done.stderr
        );
    }
}

/// Under a process limit that runs out part way through the start (other processes of the user
/// hold most of it), the ranks started so far are stopped and reaped, and launch fails with a
/// message rather than a panic.
#[test]
fn launch_stops_the_started_ranks_when_it_cannot_start_one() {
    // Seconds: 3602.<pid>.
    let rank_marker = marker("3602.");
    let script = format!(
        "i=0; while [ $i -lt 45 ]; do sleep 3601 >/dev/null 2>&1 & i=$((i+1)); done; \
         exec \"$0\" launch --kill-grace-ms 300 -n 5 -- sleep {rank_marker}"
    );
    let child = under_process_limit("sh", &["-c", &script, NVFIPC], 60)
        .spawn()
        .unwrap();
    let group = child.id() as libc::pid_t;
    let done = wait_bounded(child, Duration::from_secs(30));
    // SAFETY: kill(2) takes no pointers; the group is the one the child led (its blockers).
    unsafe { libc::kill(-group, libc::SIGKILL) };
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
    assert!(
        done.stderr.contains("nvfipc launch: cannot start")
            && done.stderr.contains("stopping the ranks started so far"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("panicked"), "{}", done.stderr);
    assert_none_left(&rank_marker);
}

/// SIGTERM while the ranks are being started stops the start at once: the launcher stops the
/// ranks it started and exits 143, instead of starting the rest first.
#[test]
fn launch_honours_sigterm_while_starting_ranks() {
    let rank_marker = marker("3603.");
    let child = Command::new(NVFIPC)
        .args(["launch", "--kill-grace-ms", "2000", "-n", "1000", "--"])
        .args(["sleep", &rank_marker])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) takes no pointers; the child is not reaped yet.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let done = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(done.status.code(), Some(143), "{}", done.stderr);
    assert!(
        done.stderr.contains("while starting rank"),
        "{}",
        done.stderr
    );
    assert!(
        done.elapsed < Duration::from_secs(4),
        "took {:?} after SIGTERM at 300 ms",
        done.elapsed
    );
    assert_none_left(&rank_marker);
}

/// The same for `demo`: SIGTERM during its start ends it promptly, with no rank left.
#[test]
fn demo_honours_sigterm_while_starting_ranks() {
    // Milliseconds: 9<pid>.
    let rank_marker = marker("9");
    let child = Command::new(NVFIPC)
        .args(["demo", "--ranks", "400", "--transport", "host"])
        .args(["--timeout-ms", &rank_marker])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) takes no pointers; the child is not reaped yet.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let done = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(done.status.code(), Some(143), "{}", done.stderr);
    assert!(
        done.elapsed < Duration::from_secs(8),
        "took {:?} after SIGTERM at 300 ms",
        done.elapsed
    );
    assert_none_left(&rank_marker);
}
