use super::*;

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
