//! What the multi-process tests share: this test binary started again as the ranks of a
//! scenario (each runs the binary's ignored `child` test), and the environment they read.
//!
//! A rank reads `NVFIPC_T_RANK`, `NVFIPC_T_WORLD`, `NVFIPC_T_PORT` (the store server's port) and
//! `NVFIPC_T_JOB`; the scenario comes in the variable the test file names.

// Each test file uses part of it.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The arguments that make this test binary run its ignored test `test` alone (a rank's side of
/// a multi-process test), printing as it goes.
pub fn rerun_args(test: &str) -> [&str; 5] {
    [
        "--ignored",
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
    ]
}

/// Sleeps a pseudo-random time below `max_us` microseconds, the same for a rank and step in every
/// run, so that ranks reach a step in varying orders.
pub fn jitter(rank: usize, step: usize, max_us: usize) {
    let us = ((rank * 7919 + step * 104_729) % max_us) as u64;
    std::thread::sleep(Duration::from_micros(us));
}

/// splitmix64: small, fast, and the same everywhere (the random programs of the tests).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// The seeds named in the environment variable `var` (`1-40`, `7,9`, or both: `1-3,9`), else
/// `default`.
pub fn seeds_from_env(var: &str, default: Vec<u64>) -> Vec<u64> {
    let Ok(spec) = std::env::var(var) else {
        return default;
    };
    spec.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (a.trim().parse().unwrap(), b.trim().parse().unwrap());
                (a..=b).collect::<Vec<_>>()
            }
            None => vec![part.trim().parse().unwrap()],
        })
        .collect()
}

#[path = "../../src/tests/ports.rs"]
mod ports;

/// A TCP port of the loopback interface that is free right now, below the ephemeral range (see
/// `src/tests/ports.rs`).
pub fn free_port() -> u16 {
    ports::port_below_ephemeral(|port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

/// The number in the environment variable `name` (a rank's setting; panics when unset).
pub fn env_usize(name: &str) -> usize {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} unset"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} not a number"))
}

/// The rank processes of one scenario; whatever is still running when this is dropped (a failed
/// assertion in the parent) is killed and reaped.
pub struct Ranks {
    pub children: Vec<Child>,
}

impl Ranks {
    /// Starts `world` ranks of `scenario` (passed in `role_var`) against the store at `port`.
    pub fn spawn(role_var: &str, scenario: &str, world: usize, port: u16, job: &str) -> Ranks {
        let exe = std::env::current_exe().expect("test binary path");
        let children = (0..world)
            .map(|rank| {
                Command::new(&exe)
                    .args(rerun_args("child"))
                    .env(role_var, scenario)
                    .env("NVFIPC_T_RANK", rank.to_string())
                    .env("NVFIPC_T_WORLD", world.to_string())
                    .env("NVFIPC_T_PORT", port.to_string())
                    .env("NVFIPC_T_JOB", job)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn rank")
            })
            .collect();
        Ranks { children }
    }

    /// Waits, at most `limit` in all, for every rank (a rank still running then is killed);
    /// returns each rank's (exit success, stdout+stderr).
    pub fn collect(&mut self, limit: Duration) -> Vec<(bool, String)> {
        let deadline = Instant::now() + limit;
        let mut status = vec![None; self.children.len()];
        while status.iter().any(Option::is_none) && Instant::now() < deadline {
            for (i, c) in self.children.iter_mut().enumerate() {
                if status[i].is_none() {
                    status[i] = c.try_wait().expect("try_wait");
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.children
            .iter_mut()
            .zip(&status)
            .map(|(c, s)| {
                let ok = match s {
                    Some(s) => s.success(),
                    None => {
                        let _ = c.kill();
                        let _ = c.wait();
                        false
                    }
                };
                let mut out = String::new();
                if let Some(mut o) = c.stdout.take() {
                    let _ = o.read_to_string(&mut out);
                }
                if let Some(mut e) = c.stderr.take() {
                    let _ = e.read_to_string(&mut out);
                }
                (ok, out)
            })
            .collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
