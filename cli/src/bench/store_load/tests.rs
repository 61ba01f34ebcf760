use super::*;
use nvfipc_store::server::StoreServer;

#[test]
fn drives_an_in_process_server() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let r = drive(server.port(), 3, Duration::from_millis(50), "t").unwrap();
    assert_eq!(r.clients, 3);
    assert!(r.ops >= 6 && r.ops % 2 == 0, "{r:?}");
    assert!(r.get_p50_ns.is_some() && r.get_p50_ns <= r.get_p90_ns);
}

#[test]
fn median_round_is_reported_with_every_rate() {
    let round = |ops: u64| LoadResult {
        clients: 2,
        ops,
        elapsed: Duration::from_secs(1),
        get_p50_ns: Some(ops),
        get_p90_ns: Some(ops),
        round_rates: Vec::new(),
    };
    let median = LoadResult::median_of(vec![round(300), round(100), round(200)]).unwrap();
    assert_eq!(median.ops, 200);
    assert_eq!(median.get_p50_ns, Some(200));
    assert_eq!(median.round_rates, vec![300.0, 100.0, 200.0]);
    assert!((median.spread() - 1.0).abs() < 1e-9);
    assert_eq!(LoadResult::median_of(vec![round(5)]).unwrap().spread(), 0.0);
    assert!(LoadResult::median_of(Vec::new()).is_none());
}
