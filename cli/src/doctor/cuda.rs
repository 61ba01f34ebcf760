//! The CUDA gates: driver and runtime, devices and their compute mode, peer access between every
//! pair, VMM with POSIX fds and FABRIC (probed by a real round trip), multicast.

use super::probe::{vmm_round_trip, VmmHandle};
use super::{Check, Verdict};
use nvfuser_ipc::tools::cuda::driver;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`.
const ATTR_COMPUTE_MODE: i32 = 20;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` (CUDA 10.2).
const ATTR_VMM: i32 = 102;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (CUDA 12.3).
const ATTR_FABRIC: i32 = 128;
/// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` (CUDA 12.1).
const ATTR_MULTICAST: i32 = 132;

fn cannot(name: &str, why: &str) -> Check {
    Check::new("cuda", name, Verdict::CannotCheck).detail(why.to_string())
}

pub fn checks() -> Vec<Check> {
    let mut checks = Vec::new();
    let runtime = match super::probe::runtime_version() {
        Ok((lib, v)) => Check::new("cuda", "runtime", Verdict::Pass)
            .detail(format!("{lib}: CUDA runtime {}", driver::format_version(v))),
        Err(e) => Check::new("cuda", "runtime", Verdict::CannotCheck).detail(format!(
            "{e}; this library needs only the driver (PyTorch and nvFuser bring their own \
             runtime)"
        )),
    };
    let drv = match driver::driver() {
        Ok(d) => d,
        Err(e) => {
            checks.push(
                Check::new("cuda", "driver", Verdict::CannotCheck)
                    .detail(e.message)
                    .fix(
                        "on a GPU machine: install the NVIDIA driver; host buffers work without it",
                    ),
            );
            checks.push(runtime);
            let why = "no usable CUDA driver";
            for name in [
                "devices and compute mode",
                "peer access",
                "VMM with POSIX fds",
                "VMM with FABRIC handles",
                "multicast",
            ] {
                checks.push(cannot(name, why));
            }
            return checks;
        }
    };
    checks.push(Check::new("cuda", "driver", Verdict::Pass).detail(format!(
        "CUDA driver {} (at least {} is required)",
        driver::format_version(drv.version),
        driver::format_version(driver::MIN_DRIVER_VERSION)
    )));
    if let Ok((_, v)) = super::probe::runtime_version() {
        if v > drv.version {
            checks.push(runtime.clone().verdict_fail(format!(
                "the runtime ({}) is newer than the driver ({}): CUDA programs fail with \
                 cudaErrorInsufficientDriver",
                driver::format_version(v),
                driver::format_version(drv.version)
            )));
        } else {
            checks.push(runtime);
        }
    } else {
        checks.push(runtime);
    }
    let count = match driver::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => {
            checks.push(
                Check::new("cuda", "devices and compute mode", Verdict::CannotCheck)
                    .detail("the driver sees no device")
                    .fix("check CUDA_VISIBLE_DEVICES and nvidia-smi"),
            );
            return checks;
        }
        Err(e) => {
            checks.push(cannot("devices and compute mode", &e.message));
            return checks;
        }
    };
    checks.push(compute_modes(count));
    checks.push(peer_access(count));
    checks.extend(vmm(count));
    checks.push(multicast(count));
    checks
}

trait FailWith {
    fn verdict_fail(self, detail: String) -> Check;
}

impl FailWith for Check {
    fn verdict_fail(mut self, detail: String) -> Check {
        self.verdict = Verdict::Fail;
        self.detail = detail;
        self.fix = "install a driver at least as new as the runtime".into();
        self
    }
}

fn compute_modes(count: i32) -> Check {
    let name = "devices and compute mode";
    let mut modes = Vec::new();
    let mut prohibited = Vec::new();
    let mut exclusive = Vec::new();
    for d in 0..count {
        match driver::device_attribute_code(d, ATTR_COMPUTE_MODE) {
            Ok(0) => modes.push(format!("{d}: default")),
            Ok(2) => {
                prohibited.push(d);
                modes.push(format!("{d}: prohibited"));
            }
            Ok(3) => {
                exclusive.push(d);
                modes.push(format!("{d}: exclusive process"));
            }
            Ok(m) => modes.push(format!("{d}: mode {m}")),
            Err(e) => return cannot(name, &e.message),
        }
    }
    let detail = format!("{count} device(s); compute mode {}", modes.join(", "));
    if !prohibited.is_empty() {
        Check::new("cuda", name, Verdict::Fail)
            .detail(detail)
            .fix(format!(
                "devices {prohibited:?} accept no context: nvidia-smi -i N -c DEFAULT"
            ))
    } else if !exclusive.is_empty() {
        Check::new("cuda", name, Verdict::Warn)
            .detail(detail)
            .fix(format!(
                "devices {exclusive:?} take one process each: a peer can still map their memory, \
             but two ranks cannot share one of them (nvidia-smi -i N -c DEFAULT)"
            ))
    } else {
        Check::new("cuda", name, Verdict::Pass).detail(detail)
    }
}

fn peer_access(count: i32) -> Check {
    let name = "peer access";
    if count < 2 {
        return Check::new("cuda", name, Verdict::Pass)
            .detail("one device: no pair to check (ranks sharing it map each other's memory)");
    }
    let mut missing = Vec::new();
    for a in 0..count {
        for b in 0..count {
            if a == b {
                continue;
            }
            match driver::can_access_peer(a, b) {
                Ok(true) => {}
                Ok(false) => missing.push(format!("{a}->{b}")),
                Err(e) => return cannot(name, &e.message),
            }
        }
    }
    let pairs = count * (count - 1);
    if missing.is_empty() {
        Check::new("cuda", name, Verdict::Pass)
            .detail(format!("all {pairs} ordered pairs of {count} devices"))
    } else {
        Check::new("cuda", name, Verdict::Fail)
            .detail(format!(
                "{} of {pairs} ordered pairs lack peer access: {}",
                missing.len(),
                missing.join(", ")
            ))
            .fix(
                "a kernel cannot read a peer's buffer across these pairs (copies still work): \
                 check nvidia-smi topo -m, NVLink, and PCIe ACS/IOMMU settings",
            )
    }
}

fn vmm(count: i32) -> Vec<Check> {
    let mut posix = Vec::new();
    let mut fabric = Vec::new();
    for d in 0..count {
        let supported = driver::device_attribute_code(d, ATTR_VMM).unwrap_or(0) != 0;
        if !supported {
            posix.push((d, Err("the device does not support VMM".to_string())));
            fabric.push((d, Err("the device does not support VMM".to_string())));
            continue;
        }
        posix.push((
            d,
            vmm_round_trip(d, VmmHandle::PosixFd).map_err(|e| e.message),
        ));
        let fabric_attr = driver::device_attribute_code(d, ATTR_FABRIC);
        fabric.push((
            d,
            match fabric_attr {
                Ok(0) => Err("the device reports no FABRIC handle support".to_string()),
                Err(e) => Err(format!(
                    "the driver does not know FABRIC handles ({})",
                    e.message
                )),
                Ok(_) => vmm_round_trip(d, VmmHandle::Fabric).map_err(|e| e.message),
            },
        ));
    }
    let summarize = |results: &[(i32, Result<String, String>)]| -> (bool, String) {
        let failed: Vec<String> = results
            .iter()
            .filter_map(|(d, r)| r.as_ref().err().map(|e| format!("device {d}: {e}")))
            .collect();
        if failed.is_empty() {
            let how = results[0].1.as_ref().cloned().unwrap_or_default();
            (true, format!("on all {} device(s): {how}", results.len()))
        } else {
            (false, failed.join("; "))
        }
    };
    let (posix_ok, posix_detail) = summarize(&posix);
    let (fabric_ok, fabric_detail) = summarize(&fabric);
    vec![
        if posix_ok {
            Check::new("cuda", "VMM with POSIX fds", Verdict::Pass).detail(posix_detail)
        } else {
            Check::new("cuda", "VMM with POSIX fds", Verdict::Fail)
                .detail(posix_detail)
                .fix(
                    "PyTorch's expandable segments cannot be shared: use the default \
                     allocator, or a driver and device with VMM",
                )
        },
        if fabric_ok {
            Check::new("cuda", "VMM with FABRIC handles", Verdict::Pass).detail(fabric_detail)
        } else {
            Check::new("cuda", "VMM with FABRIC handles", Verdict::Warn)
                .detail(fabric_detail)
                .fix(
                    "nothing within one node (POSIX fds are used); across the nodes of an \
                     NVLink domain (GB200 NVL72): run the IMEX daemon and give the job an IMEX \
                     channel (/dev/nvidia-caps-imex-channels/channel0)",
                )
        },
    ]
}

fn multicast(count: i32) -> Check {
    let name = "multicast";
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for d in 0..count {
        match driver::device_attribute_code(d, ATTR_MULTICAST) {
            Ok(0) => no.push(d),
            Ok(_) => yes.push(d),
            Err(e) => {
                return Check::new("cuda", name, Verdict::Warn)
                    .detail(format!(
                        "the driver does not know multicast objects ({})",
                        e.message
                    ))
                    .fix("nothing for this library; NVLink SHARP (NVLS) needs CUDA 12.1+")
            }
        }
    }
    if no.is_empty() {
        Check::new("cuda", name, Verdict::Pass)
            .detail(format!("all {count} device(s) support multicast objects"))
    } else {
        Check::new("cuda", name, Verdict::Warn)
            .detail(format!(
                "devices {no:?} do not support multicast objects{}",
                if yes.is_empty() {
                    String::new()
                } else {
                    format!(" (devices {yes:?} do)")
                }
            ))
            .fix(
                "nothing for this library's exchange; NVLink SHARP (NVLS) collectives need \
                 NVSwitch systems with multicast",
            )
    }
}
