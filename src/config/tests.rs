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

const TORCHRUN: &[(&str, &str)] = &[
    ("RANK", "3"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "3"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "node0"),
    ("MASTER_PORT", "29500"),
];

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
fn torchrun_variables() {
    let cfg = EnvConfig::from_lookup(env(TORCHRUN)).unwrap();
    assert_eq!(cfg.ranks, RankInfo::new(3, 8, 3, 4).unwrap());
    assert_eq!(
        cfg.store,
        StoreSource::Master(HostPort::new("node0", 29500))
    );
    assert_eq!(cfg.timeout, None);
}

#[test]
fn open_mpi_wins_over_torchrun_and_slurm() {
    let mut vars = TORCHRUN.to_vec();
    vars.extend([
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("SLURM_PROCID", "0"),
        ("NVFUSER_MASTER_ADDR", "10.0.0.1"),
    ]);
    let cfg = EnvConfig::from_lookup(env(&vars)).unwrap();
    assert_eq!(cfg.ranks, RankInfo::new(1, 2, 1, 2).unwrap());
    // NVFUSER_MASTER_ADDR beats MASTER_ADDR; the port still comes from MASTER_PORT.
    assert_eq!(cfg.store.addr(), &HostPort::new("10.0.0.1", 29500));
}

#[test]
fn nvfuser_world_variables_default_to_localhost_29542() {
    let cfg = EnvConfig::from_lookup(env(&[
        ("WORLD_RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("WORLD_LOCAL_RANK", "0"),
        ("WORLD_LOCAL_SIZE", "2"),
    ]))
    .unwrap();
    assert_eq!(cfg.ranks, RankInfo::new(0, 2, 0, 2).unwrap());
    assert_eq!(
        cfg.store,
        StoreSource::Master(HostPort::new("localhost", DEFAULT_MASTER_PORT))
    );
}

#[test]
fn slurm_variables() {
    let ranks = RankInfo::from_lookup(env(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "2"),
    ]))
    .unwrap();
    assert_eq!(ranks, RankInfo::new(5, 6, 1, 2).unwrap());
}

#[test]
fn store_addr_and_timeout() {
    let mut vars = TORCHRUN.to_vec();
    vars.extend([
        ("NVFIPC_STORE_ADDR", "[::1]:4000"),
        ("NVFIPC_TIMEOUT_MS", "2500"),
    ]);
    let cfg = EnvConfig::from_lookup(env(&vars)).unwrap();
    assert_eq!(cfg.store, StoreSource::External(HostPort::new("::1", 4000)));
    assert_eq!(cfg.store.addr().to_string(), "[::1]:4000");
    assert_eq!(cfg.timeout, Some(Duration::from_millis(2500)));

    // A multi-node job with a running store needs no master address.
    let cfg = EnvConfig::from_lookup(env(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("NVFIPC_STORE_ADDR", "store.example:29500"),
    ]))
    .unwrap();
    assert_eq!(cfg.store.addr().to_string(), "store.example:29500");
}

fn err_of(vars: &[(&str, &str)]) -> Error {
    EnvConfig::from_lookup(env(vars)).unwrap_err()
}

#[test]
fn malformed_values_name_variable_and_value() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("RANK", "x")], "RANK=\"x\" is not a non-negative integer"),
        (
            &[("RANK", "-1")],
            "RANK=\"-1\" is not a non-negative integer",
        ),
        (&[("RANK", "")], "RANK=\"\" is not a non-negative integer"),
        (&[("RANK", "8")], "rank 8 is not below the world size 8"),
        (&[("LOCAL_RANK", "4")], "local rank 4 is not below"),
        (&[("WORLD_SIZE", "0")], "world size must be at least 1"),
        (
            &[("LOCAL_WORLD_SIZE", "9")],
            "local world size must be between",
        ),
        (
            &[("MASTER_PORT", "70000")],
            "MASTER_PORT=\"70000\" is not a port",
        ),
        (&[("MASTER_PORT", "0")], "MASTER_PORT=\"0\" is not a port"),
        (&[("MASTER_ADDR", "")], "MASTER_ADDR is set but empty"),
        (&[("MASTER_ADDR", "127.0.0.1")], "loopback address"),
        (
            &[("NVFIPC_STORE_ADDR", "host")],
            "NVFIPC_STORE_ADDR=\"host\"",
        ),
        (&[("NVFIPC_STORE_ADDR", ":12")], "empty host"),
        (&[("NVFIPC_STORE_ADDR", "h:abc")], "not in 1..=65535"),
        (&[("NVFIPC_TIMEOUT_MS", "0")], "NVFIPC_TIMEOUT_MS=\"0\""),
        (
            &[("NVFIPC_TIMEOUT_MS", "1s")],
            "positive number of milliseconds",
        ),
    ];
    for (overrides, needle) in cases {
        let mut vars: Vec<(&str, &str)> = TORCHRUN
            .iter()
            .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
            .copied()
            .collect();
        vars.extend_from_slice(overrides);
        let err = err_of(&vars);
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains(needle), "{needle:?} not in: {err}");
    }
    let err = err_of(&[("RANK", "8"), ("WORLD_SIZE", "8")]);
    assert!(
        err.message.contains("none of OMPI_COMM_WORLD_LOCAL_RANK"),
        "{err}"
    );
    // The local size alone missing: named, with what it means and how to set it.
    let err = err_of(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]);
    let needle = "the number of ranks on this node (none of OMPI_COMM_WORLD_LOCAL_SIZE/\
        WORLD_LOCAL_SIZE/LOCAL_WORLD_SIZE/SLURM_NTASKS_PER_NODE is set) missing; set one";
    assert!(err.message.contains(needle), "{err}");
    assert!(err.message.contains("local size and rank equal"), "{err}");
}

#[test]
fn missing_everything_is_not_found() {
    let err = err_of(&[]);
    assert_eq!(err.status, Status::NotFound);
    assert!(err.message.contains("nvfipc launch"), "{err}");
}

#[test]
fn multi_node_without_master_is_an_error() {
    let err = err_of(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
    ]);
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message.contains("NVFUSER_MASTER_ADDR/MASTER_ADDR"),
        "{err}"
    );
}

#[test]
fn host_port_parsing() {
    assert_eq!(
        HostPort::parse("V", "localhost:1").unwrap(),
        HostPort::new("localhost", 1)
    );
    assert_eq!(
        HostPort::parse("V", " 10.1.2.3:29500 ").unwrap(),
        HostPort::new("10.1.2.3", 29500)
    );
    assert!(HostPort::parse("V", "[::1:5").is_err());
    assert_eq!(HostPort::new("h", 5).to_string(), "h:5");
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

mod log {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_warn_every_subsystem_to_stderr() {
        let c = LogConfig::from_lookup(env(&[]), "h", 1);
        assert_eq!(c.level, LevelFilter::Warn);
        assert_eq!(c.subsystems, Subsystem::ALL_MASK);
        assert_eq!(c.file, None);
        assert!(c.problems.is_empty());
    }

    #[test]
    fn levels_in_any_case() {
        for (text, want) in [
            ("info", LevelFilter::Info),
            (" TRACE ", LevelFilter::Trace),
            ("Warn", LevelFilter::Warn),
            ("off", LevelFilter::Off),
            ("debug", LevelFilter::Debug),
        ] {
            assert_eq!(parse_level(text), Some(want), "{text}");
        }
        assert_eq!(parse_level("verbose"), None);
    }

    #[test]
    fn a_bad_level_is_reported_and_warn_is_used() {
        let c = LogConfig::from_lookup(env(&[(DEBUG_VAR, "loud")]), "h", 1);
        assert_eq!(c.level, LevelFilter::Warn);
        assert_eq!(c.problems.len(), 1);
        assert!(
            c.problems[0].contains("NVFIPC_DEBUG=\"loud\""),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn subsystem_lists_and_exclusions() {
        let ex = Subsystem::Exchange.bit();
        let st = Subsystem::Store.bit();
        assert_eq!(parse_subsystems("exchange,store"), Ok(ex | st));
        assert_eq!(parse_subsystems(" EXCHANGE , "), Ok(ex));
        assert_eq!(parse_subsystems("ALL"), Ok(Subsystem::ALL_MASK));
        assert_eq!(parse_subsystems("^exchange"), Ok(Subsystem::ALL_MASK & !ex));
        assert_eq!(parse_subsystems("exchange,nccl"), Err("nccl".to_string()));
        let c = LogConfig::from_lookup(env(&[(DEBUG_SUBSYS_VAR, "gpu")]), "h", 1);
        assert_eq!(c.subsystems, Subsystem::ALL_MASK);
        assert!(
            c.problems[0].contains("\"gpu\" is not a subsystem"),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn file_paths_expand_host_and_pid() {
        assert_eq!(
            expand_path("/tmp/%h.%p.log", "node7", 42),
            "/tmp/node7.42.log"
        );
        assert_eq!(expand_path("a%%b%", "h", 1), "a%b%");
        assert_eq!(expand_path("x%qy", "h", 1), "x%qy");
        let c = LogConfig::from_lookup(env(&[(DEBUG_FILE_VAR, "/l/%p")]), "h", 9);
        assert_eq!(c.file.as_deref(), Some("/l/9"));
        let c = LogConfig::from_lookup(env(&[(DEBUG_FILE_VAR, " ")]), "h", 9);
        assert_eq!(c.file, None);
        assert_eq!(c.problems.len(), 1);
    }
}

mod fdpass {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn reads_the_environment_and_refuses_nonsense() {
        let c = FdPassConfig::from_lookup(env(&[])).unwrap();
        assert_eq!(c, FdPassConfig::default());
        assert!(c.socket_dir.is_some());
        let c = FdPassConfig::from_lookup(env(&[
            (SOCKET_DIR_VAR, "/shared/sock"),
            (RUNGS_VAR, "pidfd, path,pidfd"),
            (PTRACER_VAR, "none"),
        ]))
        .unwrap();
        assert_eq!(c.socket_dir, Some(PathBuf::from("/shared/sock")));
        assert_eq!(c.rungs, vec![Rung::Pidfd, Rung::Path]);
        assert!(!c.allow_ptracer);
        assert!(
            !FdPassConfig::default().allow_ptracer,
            "no PR_SET_PTRACER_ANY by default"
        );
        let c = FdPassConfig::from_lookup(env(&[(PTRACER_VAR, "any")])).unwrap();
        assert!(c.allow_ptracer);
        let c = FdPassConfig::from_lookup(env(&[(SOCKET_DIR_VAR, "none")])).unwrap();
        assert_eq!(c.socket_dir, None);
        for (k, v, needle) in [
            (SOCKET_DIR_VAR, "rel/dir", "absolute"),
            (RUNGS_VAR, "abstract,tcp", "\"tcp\" is not a rung"),
            (PTRACER_VAR, "maybe", "any"),
        ] {
            let e = FdPassConfig::from_lookup(env(&[(k, v)])).unwrap_err();
            assert!(e.message.contains(needle) && e.message.contains(k), "{e}");
        }
    }
}

#[test]
fn the_rung_table_is_in_discriminant_order() {
    for (i, (rung, name, _)) in RUNGS.iter().enumerate() {
        assert_eq!(*rung as usize, i);
        assert_eq!(rung.name(), *name);
        assert_eq!(Rung::parse(name), Some(*rung));
    }
}
