use super::*;
use nvfipc_store::client::{ConnectOptions, TcpStore};
use nvfipc_store::server::StoreServer;

#[test]
fn seed_keys_match_upstream() {
    assert_eq!(
        seed_key(1, 0, 1),
        "nvfuser_ipc_handle_info_P2PComm_dst=1_src=0_rank=1"
    );
}

#[test]
fn torch_style_barrier_releases_only_when_all_arrived() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let connect = || {
        Arc::new(TcpStore::connect("127.0.0.1", server.port(), &ConnectOptions::default()).unwrap())
    };
    let (a, b) = (connect(), connect());
    let timeout = Duration::from_millis(200);
    let mut alone = TorchStyleBarrier::new("t", 2, timeout);
    // One of two ranks: times out.
    assert!(alone.wait(&*a).is_err());
    let mut ba = TorchStyleBarrier::new("u", 2, Duration::from_secs(10));
    let mut bb = TorchStyleBarrier::new("u", 2, Duration::from_secs(10));
    let other = std::thread::spawn(move || {
        for _ in 0..3 {
            bb.wait(&*b).unwrap();
        }
    });
    for _ in 0..3 {
        ba.wait(&*a).unwrap();
    }
    other.join().unwrap();
}
