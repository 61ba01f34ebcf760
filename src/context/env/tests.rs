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
