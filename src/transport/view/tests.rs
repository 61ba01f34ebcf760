use super::*;
use crate::error::Status;

fn ext(rank: usize, bytes: u64, lead: u64, span: u64) -> Extent {
    Extent {
        rank,
        bytes,
        lead,
        span,
    }
}

#[test]
fn rounding() {
    assert_eq!(round_up(0, 4096), Some(0));
    assert_eq!(round_up(1, 4096), Some(4096));
    assert_eq!(round_up(4096, 4096), Some(4096));
    assert_eq!(round_up(4097, 4096), Some(8192));
    assert_eq!(round_up(7, 3), Some(9));
    assert_eq!(round_up(5, 0), Some(5));
    assert_eq!(round_up(u64::MAX, 4096), None);
}

#[test]
fn the_stride_holds_the_buffer_and_its_lead_in_whole_granules() {
    const G: u64 = 2 << 20;
    // A buffer of 1 MiB, 1.5 MiB into its granule: it crosses into a second granule.
    let lead = 3 << 19;
    let all: Vec<Extent> = (0..4).map(|r| ext(r, 1 << 20, lead, 2 * G)).collect();
    let layout = plan(&all, G).unwrap();
    assert_eq!(layout.stride, 2 * G);
    assert_eq!(layout.lead, lead);
    assert_eq!(layout.reserved_bytes(), 8 * G);
    assert_eq!(layout.slot(3), 6 * G);
    // A host buffer of 100 bytes at offset 10 of its page: one page per member.
    let host: Vec<Extent> = (0..2).map(|r| ext(r, 100, 10, 4096)).collect();
    assert_eq!(plan(&host, 4096).unwrap().stride, 4096);
    // Pieces of different spans share the widest slot.
    let mixed = [ext(0, 64, 0, G), ext(1, 64, 0, 10 * G)];
    assert_eq!(plan(&mixed, G).unwrap().stride, 10 * G);
}

#[test]
fn members_that_differ_are_named() {
    let sizes = [
        ext(0, 4096, 0, 4096),
        ext(1, 4096, 0, 4096),
        ext(2, 8192, 0, 8192),
        ext(5, 4096, 0, 4096),
    ];
    let err = plan(&sizes, 4096).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message.contains("ranks 0, 1, 5: 4096; rank 2: 8192"),
        "{err}"
    );
    let leads = [ext(0, 64, 0, 4096), ext(1, 64, 128, 4096)];
    let err = plan(&leads, 4096).unwrap_err();
    assert!(err.message.contains("rank 0: 0; rank 1: 128"), "{err}");
    assert!(err.message.contains("different offsets"), "{err}");
    assert!(plan(&[], 4096).is_err());
    let err = plan(&[ext(0, 64, 4090, 4096)], 4096).unwrap_err();
    assert_eq!(err.status, Status::Internal);
    let huge: Vec<Extent> = (0..4).map(|r| ext(r, 1, 0, u64::MAX / 2)).collect();
    assert!(plan(&huge, 4096).is_err());
}
