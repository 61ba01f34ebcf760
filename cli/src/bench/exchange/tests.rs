use super::*;

#[test]
fn pool_buffers_move_inside_their_segments() {
    let job = format!("ut-bench-pool-{}", std::process::id());
    let bytes = 1 << 16;
    let p = PoolBuffers::new(MemKind::Host, &job, bytes).unwrap();
    let mut seen = std::collections::HashSet::new();
    for step in 0..32 {
        let [send, recv] = p.step(step);
        let send_seg = p.segments[step % POOL_SEGMENTS].addr();
        let recv_seg = p.segments[(step + 1) % POOL_SEGMENTS].addr();
        assert!(
            send >= send_seg && send + bytes <= send_seg + p.half,
            "step {step}"
        );
        assert!(recv >= recv_seg + p.half && recv + bytes <= recv_seg + 2 * p.half);
        assert_eq!((send - send_seg) % 256, 0);
        seen.insert(send - send_seg);
    }
    assert!(seen.len() > 16, "offsets vary from call to call");
}

#[test]
fn schedules() {
    for step in 0..6 {
        assert!(Scenario::Cold.swaps(3, step));
        assert_eq!(Scenario::Warm.swaps(0, step), step == 0);
        assert_eq!(Scenario::Asym.swaps(1, step), step == 0);
    }
    assert!(Scenario::Asym.swaps(2, 1) && !Scenario::Asym.swaps(2, 2));
    assert!(Scenario::Pool.swaps(1, 5));
    assert_eq!(Scenario::Pool.untimed(), POOL_SEGMENTS + 1);
    assert_eq!(Scenario::Cold.untimed(), 1);
    assert_eq!(floor_ns(&[], &[10, 20, 30], &[5]), Some(30));
    assert_eq!(floor_ns(&[7], &[10, 20, 30], &[5]), Some(37));
    assert_eq!(floor_ns(&[7], &[], &[5]), None);
}
