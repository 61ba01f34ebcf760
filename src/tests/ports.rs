//! Test ports below Linux's ephemeral range (32768 and up): the servers and connections of tests
//! running beside one take ephemeral ports, so none of them can take a port picked here between
//! the probe and its use. Shared by the unit tests and, through `#[path]`, `tests/common` and
//! `cli/tests/doctor.rs`.

/// The first port in 20000..32000, in a per-process pseudo-random order, that `free` accepts
/// (the caller binds it the way it will be used).
pub fn port_below_ephemeral(free: impl Fn(u16) -> bool) -> u16 {
    let seed = u64::from(std::process::id())
        ^ u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
        );
    (0..1000u64)
        .map(|i| {
            20_000 + (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7_919) % 12_000) as u16
        })
        .find(|&port| free(port))
        .expect("a free port between 20000 and 32000")
}
