use super::*;
use crate::store::client::{ConnectOptions, TcpStore};
use crate::store::server::StoreServer;

impl FdPass {
    /// Connections kept to peers' responders.
    fn kept_connections(&self) -> usize {
        lock(&self.connections).len()
    }
}

#[test]
fn one_instance_per_process_job_and_rank_started_once_withdrawn_on_drop() {
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        TcpStore::connect("127.0.0.1", server.port(), &ConnectOptions::default()).unwrap(),
    );
    let config = FdPassConfig {
        socket_dir: None,
        ..FdPassConfig::default()
    };
    let a = FdPass::for_job(store.clone(), "unit", "j", 0, config.clone());
    let b = FdPass::for_job(store.clone(), "unit", "j", 0, config.clone());
    assert!(Arc::ptr_eq(&a, &b));
    let other_rank = FdPass::for_job(store.clone(), "unit", "j", 1, config.clone());
    assert!(!Arc::ptr_eq(&a, &other_rank));
    assert!(a.record().is_none() && !a.responder_running(), "lazy");
    let record = a.start().unwrap();
    assert_eq!(b.start().unwrap(), record, "started once");
    assert!(a.responder_running());
    assert!(record
        .path
        .as_ref()
        .unwrap_err()
        .contains("NVFIPC_SOCKET_DIR=none"));
    let key = record_key("unit", 0);
    assert_eq!(
        store.get(&key, Duration::from_secs(5)).unwrap(),
        record.encode().into_bytes()
    );

    // A process may fetch its own descriptors too.
    let fd = crate::os::memfd::create_reserved("unit", 12345).unwrap();
    assert_eq!(
        std::fs::File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .len(),
        12345
    );
    let id = a.register(fd).unwrap();
    let got = b.fetch(0, &id, Duration::from_secs(5)).unwrap();
    assert_eq!(sys::file_identity(got.as_fd()).unwrap(), (id.dev, id.ino));

    drop((a, b));
    assert!(!store.check(&[&key]).unwrap(), "the record is withdrawn");
    let again = FdPass::for_job(store, "unit", "j", 0, config);
    assert!(
        again.record().is_none(),
        "a new instance once the last one is gone"
    );
}

#[test]
fn a_kept_connection_serves_the_next_fetch_and_is_replaced_once_closed() {
    let store: Arc<dyn Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let config = FdPassConfig {
        socket_dir: None,
        idle_timeout: Duration::from_millis(100),
        ..FdPassConfig::default()
    };
    let a = FdPass::new(store.clone(), "keep", "keep", 0, config.clone());
    let b = FdPass::new(store, "keep", "keep", 1, config);
    let id = a
        .register(crate::os::memfd::create_reserved("keep", 4096).unwrap())
        .unwrap();
    let t = Duration::from_secs(5);
    b.fetch(0, &id, t).unwrap();
    assert_eq!(b.kept_connections(), 1);
    b.fetch(0, &id, t).unwrap();
    let accepted = |p: &FdPass| p.responder_stats().unwrap().0;
    assert_eq!(accepted(&a), 1, "the second fetch reused the connection");
    // The responder closes it when idle: the next fetch connects again.
    std::thread::sleep(Duration::from_millis(400));
    b.fetch(0, &id, t).unwrap();
    assert_eq!(accepted(&a), 2);
    assert_eq!(b.kept_connections(), 1);
    // A refusal on a kept connection is still the responder's answer.
    a.unregister(&id);
    let err = b.fetch(0, &id, t).unwrap_err();
    assert_eq!(err.status, crate::error::Status::NotFound, "{err}");
}
