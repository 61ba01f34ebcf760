//! The hasher of the store's key maps: rustc-hash's FxHasher (2.x: a multiply-mix string hash
//! whose finish spreads every input bit into the bucket bits). Keys are short byte strings from
//! cluster peers; SipHash's DoS resistance is not worth its cost for a store that has no
//! authentication anyway. It replaced a hand-written Fx variant: faster on the store's key shapes
//! (docs/BENCHMARKS.md, "Store key hasher") with the same spread of barrier keys over buckets.

pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

#[cfg(test)]
mod tests;

/// The store's hot path without I/O: SET then GET through `StoreState::apply` on the key shapes
/// of the store-load benchmark and of a large world's barrier. Prints ns per request (best of
/// 20); run with `cargo test --release --lib hasher_hot_path -- --ignored --nocapture`.
#[cfg(test)]
mod hot_path {
    use super::super::state::{ConnId, StoreState};
    use crate::store::wire::Request;
    use std::time::Instant;

    #[test]
    #[ignore = "a timing, not a check"]
    fn hasher_hot_path() {
        let conn = ConnId {
            shard: 0,
            slot: 1,
            gen: 1,
        };
        let load = |i: usize| format!("load/1a2b3c4d/64/{}/{}", i % 64, i / 64);
        let barrier = |i: usize| format!("/nvfipc/barrier/0123456789abcdef/w131072/arrived/0/{i}");
        let shapes = [
            ("store-load keys", (0..8192).map(load).collect::<Vec<_>>()),
            ("barrier keys", (0..8192).map(barrier).collect()),
        ];
        for (name, keys) in shapes {
            let mut best = f64::MAX;
            for _ in 0..20 {
                let mut state = StoreState::default();
                let (mut out, mut woken) = (Vec::new(), Vec::new());
                let start = Instant::now();
                for key in &keys {
                    let set = Request::Set {
                        key: key.as_bytes(),
                        value: b"0123456789abcdef",
                    };
                    state.apply(conn, &set, &mut out, &mut woken).unwrap();
                    let get = Request::Get {
                        key: key.as_bytes(),
                    };
                    state.apply(conn, &get, &mut out, &mut woken).unwrap();
                    out.clear();
                }
                best = best.min(start.elapsed().as_nanos() as f64 / (2 * keys.len()) as f64);
            }
            println!("hot path, {name}: {best:.1} ns per request (SET/GET, 8192 keys, best of 20)");
        }
    }
}
