use super::*;
use crate::error::Status;

pub(crate) const MIB2: u64 = 2 << 20;

/// A 2 MiB segment exportable as a POSIX fd.
pub(crate) fn seg(base: u64, id: u64) -> LocalSegment {
    LocalSegment {
        base,
        size: MIB2,
        id,
        handle_types: HANDLE_TYPE_POSIX_FD,
    }
}

#[test]
fn a_buffer_inside_one_segment_needs_no_lookup() {
    let run = walk(0x1000_0040, 64, seg(0x1000_0000, 7), |_| {
        panic!("no lookup expected")
    })
    .unwrap();
    assert_eq!(run.segments.len(), 1);
    assert_eq!(run.id(), 7);
    assert_eq!((run.base(), run.size()), (0x1000_0000, MIB2));
}

#[test]
fn a_buffer_spanning_segments_walks_them_in_order() {
    let mut asked = Vec::new();
    let run = walk(
        0x1000_0000 + MIB2 - 8,
        2 * MIB2,
        seg(0x1000_0000, 1),
        |at| {
            asked.push(at);
            Ok(seg(at, 1 + asked.len() as u64))
        },
    )
    .unwrap();
    assert_eq!(asked, vec![0x1000_0000 + MIB2, 0x1000_0000 + 2 * MIB2]);
    assert_eq!(run.segments.len(), 3);
    assert_eq!(run.size(), 3 * MIB2);
    assert_ne!(
        run.id(),
        1,
        "a run of several segments has an id of its own"
    );
    let again = walk(
        0x1000_0000 + MIB2 - 8,
        2 * MIB2,
        seg(0x1000_0000, 1),
        |at| Ok(seg(at, 1 + (at - 0x1000_0000) / MIB2)),
    )
    .unwrap();
    assert_eq!(again.id(), run.id(), "the same segments give the same id");
}

#[test]
fn gaps_and_unmapped_continuations_are_errors() {
    let err = walk(0x1000_0000, 2 * MIB2, seg(0x1000_0000, 1), |at| {
        Ok(seg(at + 4096, 2))
    })
    .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("not contiguous"), "{err}");
    let err = walk(0x1000_0000, 2 * MIB2, seg(0x1000_0000, 1), |_| {
        Err(Error::invalid("not mapped"))
    })
    .unwrap_err();
    assert!(
        err.message.contains("runs past its physical allocation"),
        "{err}"
    );
    assert!(walk(u64::MAX - 4, 8, seg(0x1000_0000, 1), |at| Ok(seg(at, 2))).is_err());
}

#[test]
fn runs_are_capped() {
    let err = walk(0, u64::MAX / 2, seg(0, 1), |at| Ok(seg(at, at + 1))).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
    assert!(err.message.contains("more than 8192"), "{err}");
}

#[test]
fn segments_without_an_id_are_refused() {
    let err = walk(0x1000_0000, 8, seg(0x1000_0000, 0), |_| panic!()).unwrap_err();
    assert!(err.message.contains("no buffer id"), "{err}");
    let err = walk(0x1000_0000, 2 * MIB2, seg(0x1000_0000, 1), |at| {
        Ok(seg(at, 0))
    })
    .unwrap_err();
    assert!(err.message.contains("no buffer id"), "{err}");
}
