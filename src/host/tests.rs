use super::*;
use crate::fdpass::{FdPass, FdPassConfig};
use crate::transport::record::HandleType;
use std::sync::Arc;

/// Two fd transports (ranks 0 and 1 of `job`) on one in-memory store, abstract sockets only.
pub(crate) fn fdpass_pair(job: &str) -> (Arc<FdPass>, Arc<FdPass>) {
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let config = FdPassConfig {
        socket_dir: None,
        ..FdPassConfig::default()
    };
    (
        Arc::new(FdPass::new(store.clone(), job, job, 0, config.clone())),
        Arc::new(FdPass::new(store, job, job, 1, config)),
    )
}

#[test]
fn ids_round_trip_and_garbage_is_refused() {
    let id = FdId {
        serial: 7,
        fd: 12,
        dev: 3,
        ino: 99,
    };
    let h = fd_handle(&id);
    assert_eq!(fd_id(h.handle_type, &h.payload, "x").unwrap(), id);
    let mut bad = h.payload;
    bad[PAYLOAD_LEN - 1] = 1;
    assert!(fd_id(h.handle_type, &bad, "x").is_err());
    let err = fd_id(HandleType::CudaLegacyIpc, &h.payload, "rank 2's buffer").unwrap_err();
    assert!(err.message.contains("rank 2's buffer is a CUDA"), "{err}");
    assert!(fd_id(h.handle_type, &[0; PAYLOAD_LEN], "x").is_err());
}
