use super::*;

#[test]
fn takes_the_smallest_fitting_buffer_and_stays_bounded() {
    let mut pool = BufPool::default();
    assert!(pool.take(1).is_none());
    pool.give(Vec::with_capacity(16)); // too small to pool
    pool.give(Vec::with_capacity(POOL_BUF_MAX + 1)); // a rare huge request's: freed at once
    assert!(pool.is_empty());
    pool.give(Vec::with_capacity(4 << 20));
    pool.give(Vec::with_capacity(1 << 20));
    assert_eq!(pool.take(512 * 1024).unwrap().capacity(), 1 << 20);
    assert!(pool.take(8 << 20).is_none());
    assert!(pool.take(2 << 20).unwrap().capacity() >= 4 << 20);
    for _ in 0..100 {
        pool.give(Vec::with_capacity(8 << 20));
    }
    assert!(pool.bytes <= POOL_BYTES);
    assert_eq!(pool.bufs.len(), POOL_BYTES / (8 << 20));
}
