use super::*;
use crate::exchange::Direction;

#[test]
fn each_pair_talks_over_one_channel_that_both_sides_name_alike() {
    let group = MemberSet::new(0, 8, Some(&[5, 0, 2, 7])).unwrap();
    let mut channels = std::collections::HashSet::new();
    for &rank in group.ranks() {
        let reqs = requests(
            rank,
            &group,
            "w",
            0x1000 * (rank as u64 + 1),
            64,
            MemKind::Host,
        );
        assert_eq!(reqs.len(), 3);
        for r in &reqs {
            assert_eq!(r.tag, "symm:w");
            let (src, dst) = match r.direction {
                Direction::Send => (rank, r.peer),
                Direction::Recv => (r.peer, rank),
            };
            assert!(src < dst, "the lower rank sends");
            channels.insert((src, dst, r.direction == Direction::Send));
        }
    }
    // 6 pairs, each seen once as a send and once as a receive.
    assert_eq!(channels.len(), 12);
}

fn fake() -> ContiguousView {
    let layout = crate::transport::view::Layout {
        members: 2,
        stride: 4096,
        lead: 0,
    };
    ContiguousView::new(0x1000, layout, ())
}

fn call(ptr: u64, members: &[usize]) -> Rendezvous {
    Rendezvous {
        kind: MemKind::Host,
        ptr,
        bytes: 64,
        members: members.to_vec(),
        view: None,
    }
}

#[test]
fn a_view_survives_only_the_same_call() {
    let mut t = SymmetricTable::default();
    t.record("w", call(0x10, &[0, 1]));
    t.tags.get_mut("w").unwrap().view = Some(HeldView {
        ids: Vec::new(),
        view: fake(),
    });
    t.record("w", call(0x10, &[0, 1]));
    assert_eq!(t.views(), 1, "same buffer and group");
    t.record("w", call(0x20, &[0, 1]));
    assert_eq!(t.views(), 0, "another buffer");
    t.tags.get_mut("w").unwrap().view = Some(HeldView {
        ids: Vec::new(),
        view: fake(),
    });
    t.record("w", call(0x20, &[0, 2]));
    assert_eq!(t.views(), 0, "another group");
    assert!(t.tags.remove("w").is_some());
    assert!(t.tags.remove("w").is_none());
    assert!(!t.tags.contains_key("w"));
}
