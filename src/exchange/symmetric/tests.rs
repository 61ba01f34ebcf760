use super::*;
use crate::exchange::request::Direction;

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
