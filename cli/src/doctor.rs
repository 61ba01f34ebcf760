//! `nvfipc doctor`: checks every gate the library depends on, on this host and, when started as a
//! rank of a job (`nvfipc launch`, mpirun, torchrun, srun), between the ranks of the job.
//!
//! Every check is one line with a verdict: `pass`, `warn` (the gate is closed or small, but the
//! library has a way around it or does not need it on the default path), `fail` (the library or a
//! part of it cannot work here) or `cannot check` (what would be needed to check is missing, e.g.
//! no GPU), followed by what to change. Gates are probed rather than read where a probe is
//! possible: descriptors are passed between two processes by each rung of the fd transport, and
//! VMM allocations are created, exported, imported and mapped. The command exits 0 when no check
//! fails, 1 otherwise.

mod cuda;
mod host;
mod job;
pub mod peer;
mod probe;

use crate::args::positive_ms;
use serde_json::{json, Value};
use std::time::Duration;

pub use peer::PeerArgs;

/// Check the gates of CUDA IPC on this host and between the ranks of a job
///
/// Namespaces, /dev/shm, the open-file limit, ptrace and seccomp rules, descriptor passing
/// between two processes (SCM_RIGHTS on the abstract socket and the socket file, pidfd_getfd),
/// the CUDA driver and runtime, peer access between every GPU pair, VMM with POSIX fds and
/// FABRIC (probed), multicast and the compute mode. Started as a rank of a job (nvfipc launch -n
/// N -- nvfipc doctor, mpirun, torchrun), the ranks also compare their hosts and namespaces
/// through the job's store and pass descriptors to each other. Each line says pass, warn, fail or
/// cannot check, and what to change; exits 0 when nothing fails.
#[derive(clap::Args, Debug, PartialEq, Eq)]
#[command(override_usage = "nvfipc doctor [--json] [--local] [--timeout-ms MS]")]
pub struct DoctorArgs {
    /// Print the report as one JSON object (for tools)
    #[arg(long)]
    pub json: bool,
    /// Check this host only, also when started as a rank of a job
    #[arg(long)]
    pub local: bool,
    /// Bound of each probe and of the job's store waits
    #[arg(long = "timeout-ms", value_name = "MS", value_parser = positive_ms, default_value = "20000")]
    pub timeout: Duration,
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
    CannotCheck,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
            Verdict::CannotCheck => "cannot check",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Check {
    /// `host`, `fd passing`, `cuda` or `job`.
    pub area: &'static str,
    pub name: String,
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to change (empty when nothing needs to).
    pub fix: String,
}

impl Check {
    pub fn new(area: &'static str, name: impl Into<String>, verdict: Verdict) -> Check {
        Check {
            area,
            name: name.into(),
            verdict,
            detail: String::new(),
            fix: String::new(),
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Check {
        self.detail = detail.into();
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }

    fn to_json(&self) -> Value {
        json!({
            "area": self.area,
            "name": self.name,
            "verdict": self.verdict.word(),
            "detail": self.detail,
            "fix": self.fix,
        })
    }
}

/// Who ran the checks.
pub struct Header {
    pub host: String,
    pub pid: u32,
    /// (rank, world size, job id) when started as a rank of a job.
    pub job: Option<(usize, usize, String)>,
}

fn text_report(header: &Header, checks: &[Check]) -> String {
    let mut out = format!(
        "nvfipc doctor {}: host {}, pid {}",
        env!("CARGO_PKG_VERSION"),
        header.host,
        header.pid
    );
    if let Some((rank, world, job)) = &header.job {
        out.push_str(&format!(", rank {rank} of {world} (job {job})"));
    }
    out.push('\n');
    for c in checks {
        out.push_str(&format!(
            "{:<12} {}: {}: {}\n",
            c.verdict.word(),
            c.area,
            c.name,
            c.detail
        ));
        if !c.fix.is_empty() {
            out.push_str(&format!("{:<12} -> {}\n", "", c.fix));
        }
    }
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    out.push_str(&format!(
        "{} checks: {} pass, {} warn, {} fail, {} cannot check\n",
        checks.len(),
        count(Verdict::Pass),
        count(Verdict::Warn),
        count(Verdict::Fail),
        count(Verdict::CannotCheck)
    ));
    out
}

fn json_report(header: &Header, checks: &[Check]) -> Value {
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "host": header.host,
        "pid": header.pid,
        "rank": header.job.as_ref().map(|j| j.0),
        "world_size": header.job.as_ref().map(|j| j.1),
        "job": header.job.as_ref().map(|j| j.2.clone()),
        "ok": count(Verdict::Fail) == 0,
        "summary": {
            "pass": count(Verdict::Pass),
            "warn": count(Verdict::Warn),
            "fail": count(Verdict::Fail),
            "cannot_check": count(Verdict::CannotCheck),
        },
        "checks": checks.iter().map(Check::to_json).collect::<Vec<_>>(),
    })
}

pub fn run(args: &DoctorArgs) -> i32 {
    let mut checks = host::checks();
    checks.extend(peer::probe(args.timeout));
    checks.extend(cuda::checks());
    let mut header = Header {
        host: nvfuser_ipc::tools::node::host_name(),
        pid: std::process::id(),
        job: None,
    };
    if !args.local {
        match job::checks(args.timeout) {
            job::JobOutcome::NotAJob => {}
            job::JobOutcome::Checked {
                rank,
                world,
                id,
                checks: more,
            } => {
                header.job = Some((rank, world, id));
                checks.extend(more);
            }
            job::JobOutcome::Failed(check) => checks.push(check),
        }
    }
    if args.json {
        println!("{}", json_report(&header, &checks));
    } else {
        print!("{}", text_report(&header, &checks));
    }
    i32::from(checks.iter().any(|c| c.verdict == Verdict::Fail))
}

#[cfg(test)]
mod tests;
