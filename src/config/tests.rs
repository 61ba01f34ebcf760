use super::*;
use crate::error::Status;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

#[test]
fn vmm_window_is_mib_or_off_and_bad_values_are_named() {
    assert_eq!(vmm_window_from_lookup(env(&[])).unwrap(), 32 << 20);
    let got = vmm_window_from_lookup(env(&[("NVFIPC_VMM_WINDOW_MIB", " 64 ")])).unwrap();
    assert_eq!(got, 64 << 20);
    assert_eq!(
        vmm_window_from_lookup(env(&[("NVFIPC_VMM_WINDOW_MIB", "0")])).unwrap(),
        0
    );
    for bad in ["-1", "32MiB", "", "4097"] {
        let err = vmm_window_from_lookup(env(&[("NVFIPC_VMM_WINDOW_MIB", bad)])).unwrap_err();
        assert!(
            err.message
                .starts_with(&format!("NVFIPC_VMM_WINDOW_MIB={bad:?} is not a window")),
            "{err}"
        );
    }
}

#[test]
fn store_threads_variable() {
    assert_eq!(store_threads_from_lookup(env(&[])).unwrap(), 1);
    for (value, want) in [("4", 4), (" 2 ", 2), ("0", 0), ("64", 64)] {
        let got = store_threads_from_lookup(env(&[("NVFIPC_STORE_THREADS", value)])).unwrap();
        assert_eq!(got, want, "{value:?}");
    }
    for bad in ["65", "-1", "two", ""] {
        let err = store_threads_from_lookup(env(&[("NVFIPC_STORE_THREADS", bad)])).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
        assert!(
            err.message
                .starts_with(&format!("NVFIPC_STORE_THREADS={bad:?} is not")),
            "{err}"
        );
    }
}

#[test]
fn job_tags() {
    assert_eq!(job_tag_from_lookup(env(&[])), None);
    assert_eq!(
        job_tag_from_lookup(env(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "2")])),
        Some(("77.2".into(), "SLURM_JOB_ID"))
    );
    assert_eq!(
        job_tag_from_lookup(env(&[
            ("SLURM_JOB_ID", "77"),
            ("PMIX_NAMESPACE", "prterun-node0-1234@1")
        ])),
        Some(("prterun-node0-1234_1".into(), "PMIX_NAMESPACE"))
    );
    assert_eq!(
        job_tag_from_lookup(env(&[
            ("NVFIPC_JOB_TAG", "a/b"),
            ("TORCHELASTIC_RUN_ID", "x")
        ])),
        Some(("a_b".into(), "NVFIPC_JOB_TAG"))
    );
    // nvfipc launch's id comes before an outer launcher's.
    assert_eq!(
        job_tag_from_lookup(env(&[
            ("NVFIPC_LAUNCH_ID", "5f3a"),
            ("PMIX_NAMESPACE", "outer"),
            ("SLURM_JOB_ID", "77")
        ])),
        Some(("5f3a".into(), "NVFIPC_LAUNCH_ID"))
    );
    // torchrun's default run id names no run.
    assert_eq!(
        job_tag_from_lookup(env(&[("TORCHELASTIC_RUN_ID", "none")])),
        None
    );
    assert_eq!(
        job_tag_from_lookup(env(&[
            ("TORCHELASTIC_RUN_ID", "none"),
            ("SLURM_JOB_ID", "9")
        ])),
        Some(("9".into(), "SLURM_JOB_ID"))
    );
    // Open MPI under ORTE: two mpiruns differ by their URI, two jobs of one by the job id.
    let orte = |uri: &str, job: &str| {
        job_tag_from_lookup(env(&[
            ("OMPI_MCA_orte_hnp_uri", uri),
            ("OMPI_MCA_ess_base_jobid", job),
        ]))
        .unwrap()
        .0
    };
    let a = orte("3181903872.0;tcp://10.0.0.1:45687", "3181903873");
    assert!(a.starts_with("ompi-3181903873-"), "{a}");
    assert_ne!(a, orte("3181903872.0;tcp://10.0.0.1:45688", "3181903873"));
    assert_ne!(a, orte("3181903872.0;tcp://10.0.0.1:45687", "3181903874"));
    assert_eq!(
        job_tag_from_lookup(env(&[("PMIX_NAMESPACE", " "), ("NVFIPC_JOB_TAG", "")])),
        None
    );
}

#[test]
fn loopback_names() {
    assert!(is_loopback_name("localhost"));
    assert!(is_loopback_name("127.0.0.1"));
    assert!(is_loopback_name("::1"));
    assert!(is_loopback_name("[::1]"));
    assert!(!is_loopback_name("node0"));
    assert!(!is_loopback_name("10.0.0.1"));
}
