use super::*;
use crate::args::parse;

#[test]
fn parses_bench_options() {
    let a = parse::<BenchArgs>(&["--scenario", "barrier,exchange", "--json=x.json", "--quick"])
        .unwrap()
        .normalized();
    assert_eq!(a.parts, vec![Part::Exchange, Part::Barrier]);
    assert_eq!(a.json, Some(PathBuf::from("x.json")));
    assert!(a.quick && !a.no_torch);
    assert_eq!(parse::<BenchArgs>(&[]).unwrap().parts.len(), 4);
    let a = parse::<BenchArgs>(&["--scenario", "post"]).unwrap();
    assert_eq!(a.parts, vec![Part::Post]);
    let a = parse::<BenchArgs>(&["--server-threads=2", "--busy-poll-us", "0"]).unwrap();
    assert_eq!(
        (a.server.threads, a.server.busy_poll_us),
        (Some(2), Some(0))
    );
    assert!(parse::<BenchArgs>(&["--scenario", "gpu"]).is_err());
    let a = parse::<BenchArgs>(&["--scenario=symmetric", "--ranks", "16,32"]).unwrap();
    assert_eq!(
        (a.parts, a.ranks),
        (vec![Part::Symmetric], Some(vec![16, 32]))
    );
    assert_eq!(parse::<BenchArgs>(&[]).unwrap().ranks, None);
    assert!(parse::<BenchArgs>(&["--ranks", "1,4"]).is_err());
    assert!(parse::<BenchArgs>(&["--ranks", "4,x"]).is_err());
    assert!(parse::<BenchArgs>(&["--quick=1"]).is_err());
}

#[test]
fn rank_args_round_trip() {
    let a = RankArgs {
        role: Part::Barrier,
        steps: 7,
        bytes: 9,
        kind: MemKind::Device,
        out: PathBuf::from("/tmp/x"),
        timeout: Duration::from_millis(1500),
        device_memory: DeviceMemory::Vmm,
        floor: false,
    };
    for a in [a.clone(), RankArgs { floor: true, ..a }] {
        let args = a.to_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse::<RankArgs>(&args).unwrap(), a);
    }
    assert!(parse::<RankArgs>(&["--role", "x", "--out", "f"]).is_err());
    assert!(parse::<RankArgs>(&["--out", "f"]).is_err());
    assert!(parse::<RankArgs>(&["--role", "barrier", "--out", "f", "--steps=0"]).is_err());
}
