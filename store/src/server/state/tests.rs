//! Tests of the store logic alone: requests in, replies and wake-ups out, no sockets.

use super::*;
use crate::wire::*;

impl StoreState {
    /// Number of KV entries (what GETNUMKEYS reports).
    fn num_keys(&self) -> usize {
        self.kv.len()
    }

    /// Connections with at least one unsatisfied WAIT.
    fn waiting_connections(&self) -> usize {
        self.waits.values().filter(|p| !p.list.is_empty()).count()
    }
}

const A: ConnId = ConnId {
    shard: 0,
    slot: 0,
    gen: 1,
};
const B: ConnId = ConnId {
    shard: 1,
    slot: 1,
    gen: 2,
};
const C: ConnId = ConnId {
    shard: 0,
    slot: 2,
    gen: 3,
};

/// Applies one encoded request; returns the reply bytes and the woken connections.
fn run(
    state: &mut StoreState,
    conn: ConnId,
    encode: impl FnOnce(&mut Vec<u8>) -> crate::Result<()>,
) -> Result<(Vec<u8>, Vec<ConnId>), Refusal> {
    let mut frame = Vec::new();
    encode(&mut frame).unwrap();
    let (req, used) = parse_request(&frame).unwrap().unwrap();
    assert_eq!(used, frame.len());
    let (mut out, mut woken) = (Vec::new(), Vec::new());
    state.apply(conn, &req, &mut out, &mut woken)?;
    Ok((out, woken))
}

fn ok(
    state: &mut StoreState,
    conn: ConnId,
    encode: impl FnOnce(&mut Vec<u8>) -> crate::Result<()>,
) -> Vec<u8> {
    let (out, woken) = run(state, conn, encode).unwrap();
    assert!(woken.is_empty(), "unexpected wake-ups {woken:?}");
    out
}

fn blob(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    put_blob(&mut v, bytes);
    v
}

fn i64_reply(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn set_get_delete_num_keys_list() {
    let mut s = StoreState::default();
    assert!(ok(&mut s, A, |o| encode_set(o, "/k", "v1")).is_empty());
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/k")), blob(b"v1"));
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/missing")), blob(b""));
    ok(&mut s, A, |o| encode_set(o, "init/", "1"));
    let mut n = Vec::new();
    assert_eq!(
        ok(&mut s, A, |o| {
            encode_get_num_keys(o);
            Ok(())
        }),
        i64_reply(2)
    );
    let list = ok(&mut s, A, |o| {
        encode_list(o);
        Ok(())
    });
    let (mut keys, _) = decode_list(&list).unwrap().unwrap();
    keys.sort();
    assert_eq!(keys, vec![&b"/k"[..], b"init/"]);
    assert_eq!(ok(&mut s, A, |o| encode_delete_key(o, "/k")), i64_reply(1));
    assert_eq!(ok(&mut s, A, |o| encode_delete_key(o, "/k")), i64_reply(0));
    n.extend(ok(&mut s, A, |o| {
        encode_get_num_keys(o);
        Ok(())
    }));
    assert_eq!(n, i64_reply(1));
}

#[test]
fn add_follows_stoll_and_stores_decimal_text() {
    let mut s = StoreState::default();
    assert_eq!(ok(&mut s, A, |o| encode_add(o, "/n", 3)), i64_reply(3));
    assert_eq!(ok(&mut s, A, |o| encode_add(o, "/n", -5)), i64_reply(-2));
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/n")), blob(b"-2"));
    ok(&mut s, A, |o| encode_set(o, "/t", " \t+41xyz"));
    assert_eq!(ok(&mut s, A, |o| encode_add(o, "/t", 1)), i64_reply(42));
    for bad in ["abc", "", " ", "-", "99999999999999999999"] {
        ok(&mut s, A, |o| encode_set(o, "/bad", bad));
        let refusal = run(&mut s, A, |o| encode_add(o, "/bad", 1)).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::AddNotANumber {
                key: b"/bad".to_vec()
            }
        );
        assert!(refusal.to_string().contains("/bad"));
        // The value is left as it was.
        assert_eq!(
            ok(&mut s, A, |o| encode_get(o, "/bad")),
            blob(bad.as_bytes())
        );
    }
}

#[test]
fn format_i64_matches_to_string() {
    let mut buf = [0u8; I64_DECIMAL_MAX];
    for v in [
        0,
        1,
        -1,
        9,
        10,
        -10,
        1234567890,
        i64::MAX,
        i64::MIN,
        i64::MIN + 1,
    ] {
        assert_eq!(format_i64(v, &mut buf), v.to_string().as_bytes(), "{v}");
    }
}

#[test]
fn stoll_edge_cases() {
    assert_eq!(parse_stoll(b"-9223372036854775808"), Some(i64::MIN));
    assert_eq!(parse_stoll(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_stoll(b"9223372036854775808"), None);
    assert_eq!(parse_stoll(b"\n\x0b\x0c\r 12 34"), Some(12));
    assert_eq!(parse_stoll(b"+-1"), None);
    assert_eq!(parse_stoll(b"0x10"), Some(0));
    assert_eq!(parse_stoll(b"007"), Some(7));
}

#[test]
fn compare_set_branches_match_torch() {
    let mut s = StoreState::default();
    // Missing key, empty expected: created.
    assert_eq!(
        ok(&mut s, A, |o| encode_compare_set(o, "/a", "", "new")),
        blob(b"new")
    );
    // Exists and differs: current value returned, nothing written.
    assert_eq!(
        ok(&mut s, A, |o| encode_compare_set(o, "/a", "bad", "zzz")),
        blob(b"new")
    );
    // Exists and equal: replaced.
    assert_eq!(
        ok(&mut s, A, |o| encode_compare_set(o, "/a", "new", "v2")),
        blob(b"v2")
    );
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/a")), blob(b"v2"));
    // Missing key, non-empty expected: returns `expected`, creates nothing.
    assert_eq!(
        ok(&mut s, A, |o| encode_compare_set(o, "/m", "e", "v1")),
        blob(b"e")
    );
    assert_eq!(
        ok(&mut s, A, |o| encode_check(o, ["/m"])),
        vec![CHECK_NOT_READY]
    );
}

#[test]
fn append_check_multi_get_multi_set() {
    let mut s = StoreState::default();
    ok(&mut s, A, |o| encode_append(o, "/k", "a"));
    ok(&mut s, A, |o| encode_append(o, "/k", "+"));
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/k")), blob(b"a+"));
    ok(&mut s, A, |o| {
        encode_multi_set(o, [("/x", "1"), ("/y", "2")])
    });
    assert_eq!(
        ok(&mut s, A, |o| encode_check(o, ["/x", "/y"])),
        vec![CHECK_READY]
    );
    assert_eq!(
        ok(&mut s, A, |o| encode_check(o, ["/x", "/z"])),
        vec![CHECK_NOT_READY]
    );
    let mut expect = blob(b"2");
    expect.extend(blob(b""));
    expect.extend(blob(b"1"));
    assert_eq!(
        ok(&mut s, A, |o| encode_multi_get(o, ["/y", "/z", "/x"])),
        expect
    );
}

#[test]
fn wait_counts_missing_keys_and_wakes_once() {
    let mut s = StoreState::default();
    ok(&mut s, A, |o| encode_set(o, "/have", "1"));
    assert_eq!(
        ok(&mut s, B, |o| encode_wait(o, ["/have"])),
        vec![WAIT_STOP_WAITING]
    );
    assert!(ok(&mut s, B, |o| encode_wait(o, ["/have", "/a", "/b"])).is_empty());
    // One of two missing keys arrives: nothing yet.
    assert_eq!(
        run(&mut s, A, |o| encode_set(o, "/a", "x")).unwrap().1,
        vec![]
    );
    // A second write to the same key does not count twice.
    assert_eq!(
        run(&mut s, A, |o| encode_append(o, "/a", "y")).unwrap().1,
        vec![]
    );
    let (out, woken) = run(&mut s, A, |o| encode_add(o, "/b", 1)).unwrap();
    assert_eq!((out, woken), (i64_reply(1), vec![B]));
    assert_eq!(s.waiting_connections(), 0);
    // Later writes wake nobody.
    assert_eq!(
        run(&mut s, A, |o| encode_set(o, "/b", "2")).unwrap().1,
        vec![]
    );
}

#[test]
fn every_writing_command_wakes_waiters() {
    type Enc = Box<dyn Fn(&mut Vec<u8>) -> crate::Result<()>>;
    let writers: Vec<Enc> = vec![
        Box::new(|o| encode_set(o, "/w", "v")),
        Box::new(|o| encode_add(o, "/w", 1)),
        Box::new(|o| encode_append(o, "/w", "v")),
        Box::new(|o| encode_multi_set(o, [("/other", "1"), ("/w", "v")])),
        Box::new(|o| encode_compare_set(o, "/w", "", "v")),
        Box::new(|o| encode_queue_push(o, "/w", "v")),
    ];
    for writer in writers {
        let mut s = StoreState::default();
        assert!(ok(&mut s, B, |o| encode_wait(o, ["/w"])).is_empty());
        let (_, woken) = run(&mut s, A, |o| writer(o)).unwrap();
        assert_eq!(woken, vec![B]);
    }
    // COMPARE_SET that writes nothing wakes nobody.
    let mut s = StoreState::default();
    ok(&mut s, B, |o| encode_wait(o, ["/w"]));
    assert_eq!(
        run(&mut s, A, |o| encode_compare_set(o, "/w", "x", "v"))
            .unwrap()
            .1,
        vec![]
    );
    assert_eq!(s.waiting_connections(), 1);
}

#[test]
fn own_write_answers_the_pending_wait_in_stream_order() {
    let mut s = StoreState::default();
    assert!(ok(&mut s, A, |o| encode_wait(o, ["/k"])).is_empty());
    // The wake-up byte comes before ADD's own reply, as torch writes it.
    let (out, woken) = run(&mut s, A, |o| encode_add(o, "/k", 7)).unwrap();
    assert!(woken.is_empty());
    let mut expect = vec![WAIT_STOP_WAITING];
    expect.extend(i64_reply(7));
    assert_eq!(out, expect);
}

#[test]
fn cancel_wait_always_answers_and_drops_registrations() {
    let mut s = StoreState::default();
    let cancel = |o: &mut Vec<u8>| {
        encode_cancel_wait(o);
        Ok(())
    };
    assert_eq!(ok(&mut s, A, cancel), vec![WAIT_CANCELED]);
    ok(&mut s, A, |o| encode_wait(o, ["/never", "/k"]));
    assert_eq!(ok(&mut s, A, cancel), vec![WAIT_CANCELED]);
    assert_eq!(s.waiting_connections(), 0);
    assert!(s.waiters.is_empty());
    assert_eq!(
        run(&mut s, B, |o| encode_set(o, "/k", "v")).unwrap().1,
        vec![]
    );
}

#[test]
fn disconnect_drops_only_that_connections_waits() {
    let mut s = StoreState::default();
    ok(&mut s, A, |o| encode_wait(o, ["/k"]));
    ok(&mut s, B, |o| encode_wait(o, ["/k"]));
    s.drop_connection(A);
    let (_, woken) = run(&mut s, C, |o| encode_set(o, "/k", "v")).unwrap();
    assert_eq!(woken, vec![B]);
}

#[test]
fn queues_are_fifo_and_push_wakes_one_waiter() {
    let mut s = StoreState::default();
    let mut empty_pop = Vec::new();
    put_i64(&mut empty_pop, 0);
    assert_eq!(ok(&mut s, A, |o| encode_queue_pop(o, "/q")), empty_pop);
    assert_eq!(ok(&mut s, A, |o| encode_queue_len(o, "/q")), i64_reply(0));
    ok(&mut s, B, |o| encode_wait(o, ["/q"]));
    ok(&mut s, C, |o| encode_wait(o, ["/q"]));
    assert_eq!(
        run(&mut s, A, |o| encode_queue_push(o, "/q", "1"))
            .unwrap()
            .1,
        vec![B]
    );
    assert_eq!(
        run(&mut s, A, |o| encode_queue_push(o, "/q", "2"))
            .unwrap()
            .1,
        vec![C]
    );
    // A non-empty queue satisfies CHECK and WAIT but is not a KV key.
    assert_eq!(
        ok(&mut s, A, |o| encode_check(o, ["/q"])),
        vec![CHECK_READY]
    );
    assert_eq!(
        ok(&mut s, A, |o| encode_wait(o, ["/q"])),
        vec![WAIT_STOP_WAITING]
    );
    assert_eq!(s.num_keys(), 0);
    assert_eq!(ok(&mut s, A, |o| encode_get(o, "/q")), blob(b""));
    assert_eq!(ok(&mut s, A, |o| encode_queue_len(o, "/q")), i64_reply(2));
    let mut first = i64_reply(2);
    first.extend(blob(b"1"));
    assert_eq!(ok(&mut s, A, |o| encode_queue_pop(o, "/q")), first);
    let mut second = i64_reply(1);
    second.extend(blob(b"2"));
    assert_eq!(ok(&mut s, A, |o| encode_queue_pop(o, "/q")), second);
    assert_eq!(
        ok(&mut s, A, |o| encode_check(o, ["/q"])),
        vec![CHECK_NOT_READY]
    );
}

#[test]
fn barrier_counts_arrivals_and_releases_them_all_at_world_size() {
    let mut s = StoreState::default();
    assert!(ok(&mut s, A, |o| encode_barrier(o, "/b", 3)).is_empty());
    assert!(ok(&mut s, B, |o| encode_barrier(o, "/b", 3)).is_empty());
    assert_eq!(s.waiting_connections(), 2);
    assert_eq!(ok(&mut s, C, |o| encode_get(o, "/b")), blob(b"2"));
    // The last arrival is answered at once and releases the others.
    let (out, mut woken) = run(&mut s, C, |o| encode_barrier(o, "/b", 3)).unwrap();
    woken.sort_by_key(|c| c.gen);
    assert_eq!((out, woken), (vec![WAIT_STOP_WAITING], vec![A, B]));
    assert_eq!(s.waiting_connections(), 0);
    // A world of one (or less) never waits; a cancelled arrival still counts.
    assert_eq!(
        ok(&mut s, A, |o| encode_barrier(o, "/one", 1)),
        vec![WAIT_STOP_WAITING]
    );
    assert!(ok(&mut s, A, |o| encode_barrier(o, "/c", 2)).is_empty());
    let cancel = |o: &mut Vec<u8>| {
        encode_cancel_wait(o);
        Ok(())
    };
    assert_eq!(ok(&mut s, A, cancel), vec![WAIT_CANCELED]);
    assert_eq!(
        ok(&mut s, B, |o| encode_barrier(o, "/c", 2)),
        vec![WAIT_STOP_WAITING]
    );
    // A key holding something else than a count is refused like ADD's.
    ok(&mut s, A, |o| encode_set(o, "/t", "text"));
    let refusal = run(&mut s, A, |o| encode_barrier(o, "/t", 2)).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::AddNotANumber {
            key: b"/t".to_vec()
        }
    );
}

#[test]
fn validate_and_ping() {
    let mut s = StoreState::default();
    assert!(ok(&mut s, A, |o| {
        encode_validate(o);
        Ok(())
    })
    .is_empty());
    assert_eq!(
        ok(&mut s, A, |o| {
            encode_ping(o, 476);
            Ok(())
        }),
        476u32.to_le_bytes().to_vec()
    );
    let bad = Request::Validate { magic: 1 };
    let refusal = s
        .apply(A, &bad, &mut Vec::new(), &mut Vec::new())
        .unwrap_err();
    assert_eq!(refusal, Refusal::BadMagic(1));
}

/// Everything a streamed reply writes, unit by unit, advancing by `step` bytes at a time.
fn drain(parts: &mut VecDeque<StreamPart>, step: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(front) = parts.front_mut() {
        let mut bytes = Vec::new();
        for (prefix, prefix_len, data, pos) in front.units() {
            let mut unit = prefix[..prefix_len].to_vec();
            unit.extend_from_slice(data);
            bytes.extend_from_slice(&unit[pos..]);
        }
        let n = step.min(bytes.len());
        out.extend_from_slice(&bytes[..n]);
        if front.advance(n).is_some() {
            parts.pop_front();
        }
    }
    out
}

#[test]
fn list_snapshots_are_shared_until_the_keys_change_and_charged_to_the_budget() {
    let budget = Budget::new(1 << 20);
    let mut s = StoreState::default();
    for i in 0..100 {
        ok(&mut s, A, |o| encode_set(o, &format!("/k{i:03}"), "v"));
    }
    let list = |s: &mut StoreState, parts: &mut VecDeque<StreamPart>| {
        let cost = s.stream_cost(&Request::List);
        let charge = budget.try_take(cost).expect("budget");
        s.stream_reply(&Request::List, parts, charge);
        cost
    };
    let (mut first, mut second) = (VecDeque::new(), VecDeque::new());
    let cost = list(&mut s, &mut first);
    assert!(cost >= 100 * std::mem::size_of::<Key>());
    assert_eq!(budget.used(), cost);
    // The same keys: the same snapshot, nothing more charged.
    assert_eq!(list(&mut s, &mut second), 0);
    assert_eq!(budget.used(), cost);
    let built = ok(&mut s, B, |o| {
        encode_list(o);
        Ok(())
    });
    assert_eq!(drain(&mut first, 7), built);
    assert_eq!(drain(&mut second, 1000), built);
    assert_eq!(
        budget.used(),
        0,
        "the snapshot is given back once both are sent"
    );
    // A key added: a new snapshot.
    let mut third = VecDeque::new();
    let kept = list(&mut s, &mut third);
    ok(&mut s, A, |o| encode_set(o, "/new", "v"));
    assert_eq!(
        s.stream_cost(&Request::List),
        kept + std::mem::size_of::<Key>()
    );
    drop(third);
    assert_eq!(budget.used(), 0);
}

#[test]
fn the_budget_refuses_beyond_its_limit_unless_nothing_is_held() {
    let budget = Budget::new(100);
    let a = budget.try_take(60).unwrap();
    assert!(budget.try_take(50).is_none());
    let b = budget.try_take(40).unwrap();
    assert!(budget.spent());
    drop((a, b));
    assert_eq!(budget.used(), 0);
    // Larger than the whole budget: served alone.
    let huge = budget.try_take(1000).unwrap();
    assert!(budget.try_take(1).is_none());
    drop(huge);
    let mut out = budget.charge();
    out.set(150);
    assert!(budget.spent() && budget.try_take(1).is_none());
    out.set(10);
    assert!(budget.try_take(90).is_some());
    assert!(budget.releases() >= 3 && budget.take_freed() > 0);
}

/// A store whose WAIT registrations are charged to a budget of `all` bytes, `per_client` each.
fn limited(all: usize, per_client: usize) -> (StoreState, Arc<Budget>) {
    let budget = Budget::new(all);
    let limits = PendingLimits {
        budget: Arc::clone(&budget),
        per_client,
    };
    (StoreState::new(limits), budget)
}

/// What a WAIT registration of `keys` is charged.
fn cost(keys: &[&str]) -> usize {
    keys.iter().map(|k| WAIT_KEY_COST + k.len()).sum()
}

#[test]
fn wait_registrations_hold_pending_budget_until_satisfied_cancelled_or_gone() {
    let (mut s, budget) = limited(1 << 20, 1 << 20);
    ok(&mut s, C, |o| encode_set(o, "/have", "1"));
    // Only the missing keys are charged; a satisfied WAIT holds nothing.
    ok(&mut s, A, |o| encode_wait(o, ["/have"]));
    assert_eq!(budget.used(), 0);
    ok(&mut s, A, |o| encode_wait(o, ["/have", "/a", "/b"]));
    assert_eq!(budget.used(), cost(&["/a", "/b"]));
    // Held until the WAIT completes, then given back whole.
    ok(&mut s, C, |o| encode_set(o, "/a", "x"));
    assert_eq!(budget.used(), cost(&["/a", "/b"]));
    assert_eq!(run(&mut s, C, |o| encode_set(o, "/b", "x")).unwrap().1, [A]);
    assert_eq!(budget.used(), 0);
    // CANCEL_WAIT and a connection gone give back what their WAITs held.
    ok(&mut s, A, |o| encode_wait(o, ["/c"]));
    ok(&mut s, B, |o| encode_wait(o, ["/c", "/d"]));
    assert_eq!(budget.used(), cost(&["/c", "/c", "/d"]));
    ok(&mut s, A, |o| {
        encode_cancel_wait(o);
        Ok(())
    });
    assert_eq!(budget.used(), cost(&["/c", "/d"]));
    s.drop_connection(B);
    assert_eq!(budget.used(), 0);
    // A waiting BARRIER arrival is charged like a WAIT on its key.
    ok(&mut s, A, |o| encode_barrier(o, "/bar", 2));
    assert_eq!(budget.used(), cost(&["/bar"]));
    assert_eq!(
        run(&mut s, B, |o| encode_barrier(o, "/bar", 2)).unwrap().1,
        [A]
    );
    assert_eq!(budget.used(), 0);
    assert!(s.waiters.is_empty());
}

#[test]
fn a_wait_over_a_pending_limit_is_refused_and_registers_nothing() {
    let two = cost(&["/k0", "/k1"]);
    let (mut s, budget) = limited(2 * two, two);
    // Per client: a second WAIT of the same connection counts with its first.
    ok(&mut s, A, |o| encode_wait(o, ["/k0"]));
    let refused = run(&mut s, A, |o| encode_wait(o, ["/k1", "/k2"])).unwrap_err();
    let Refusal::Pending {
        bytes,
        limit,
        all_clients: false,
        ..
    } = &refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!((*bytes, *limit), (cost(&["/k0", "/k1", "/k2"]), two));
    let message = refused.to_string();
    assert!(
        message.starts_with("a WAIT on 2 missing keys would make the client's pending requests")
            && message.contains(&format!("per-client limit of {two}"))
            && message.contains("--pending-per-client-mib"),
        "{message}"
    );
    assert_eq!(budget.used(), cost(&["/k0"]));
    assert!(!s.waiters.contains_key(&b"/k1"[..]));
    // Across clients: the budget.
    ok(&mut s, B, |o| encode_wait(o, ["/k1", "/k2"]));
    ok(&mut s, C, |o| encode_wait(o, ["/k3"]));
    let refused = run(&mut s, C, |o| encode_wait(o, ["/k4"])).unwrap_err();
    assert!(
        matches!(refused, Refusal::Pending { all_clients: true, limit, .. } if limit == 2 * two),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("--pending-budget-mib"),
        "{refused}"
    );
    assert!(!s.waiters.contains_key(&b"/k4"[..]));
    // A request that its length fields say is longer than one client may hold.
    assert!(s.limits.frame("WAIT", two).is_ok());
    let refused = s.limits.frame("WAIT", two + 1).unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with(&format!("a WAIT request of at least {} bytes", two + 1)),
        "{refused}"
    );
}

#[test]
fn maps_give_their_memory_back_once_the_waiters_leave() {
    let mut s = StoreState::default();
    let conns: Vec<ConnId> = (0..5000)
        .map(|i| ConnId {
            shard: 0,
            slot: i,
            gen: 1,
        })
        .collect();
    for (i, &conn) in conns.iter().enumerate() {
        ok(&mut s, conn, |o| {
            encode_wait(o, [format!("/k{i}").as_str(), "/shared"])
        });
    }
    assert!(s.waiters.capacity() >= 5001 && s.waits.capacity() >= 5000);
    for &conn in &conns {
        s.drop_connection(conn);
    }
    assert!(s.waiters.is_empty() && s.waits.is_empty());
    assert!(
        s.waiters.capacity() < SHRINK_MIN && s.waits.capacity() < SHRINK_MIN,
        "{} and {} slots kept",
        s.waiters.capacity(),
        s.waits.capacity()
    );
    // Keys deleted: the same.
    for i in 0..5000 {
        ok(&mut s, A, |o| encode_set(o, &format!("/v{i}"), "x"));
    }
    for i in 0..5000 {
        ok(&mut s, A, |o| encode_delete_key(o, &format!("/v{i}")));
    }
    assert!(
        s.kv.capacity() < SHRINK_MIN,
        "{} slots kept",
        s.kv.capacity()
    );
}

/// The store's hot path without I/O: SET then GET through `StoreState::apply` on the key shapes
/// of the store-load benchmark and of a large world's barrier. Prints ns per request (best of
/// 20); run with
/// `cargo test -p nvfipc-store --release --lib hasher_hot_path -- --ignored --nocapture`.
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
            let start = std::time::Instant::now();
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
