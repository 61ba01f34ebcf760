//! Contiguous views of a symmetric allocation: every member's buffer mapped again, in rank
//! order, in one reserved virtual address range, member i's buffer at `base + i * stride`.
//!
//! A transport maps whole pieces of memory at a granularity (a page of a host file, a physical
//! allocation of device memory), so each member's buffer is mapped as the piece that holds it:
//! `lead` bytes of the piece come before the buffer, and the piece spans `span` bytes. Every
//! member gets the same slot, `stride` bytes (the largest span rounded up to the granularity), so
//! the buffers line up only when they have the same size and the same lead: [`plan`] checks that
//! and names the members that differ. What is mapped where is the transport's business
//! ([`Transport::contiguous_view`](super::Transport::contiguous_view)); the arithmetic is here.

use super::record::Record;
use super::{LocalBuffer, Mapping};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// One member of a view, as the exchange hands it to the transport.
#[derive(Clone, Copy, Debug)]
pub enum ViewMember<'a> {
    /// This rank's own buffer.
    Own { rank: usize, buffer: LocalBuffer },
    /// A peer's buffer as the exchange imported it: its record and the mapping it got.
    Peer {
        rank: usize,
        record: &'a Record,
        mapping: Mapping,
    },
}

impl ViewMember<'_> {
    pub fn rank(&self) -> usize {
        match self {
            ViewMember::Own { rank, .. } | ViewMember::Peer { rank, .. } => *rank,
        }
    }
}

/// Where one member's buffer lies in the piece of memory that is mapped for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub rank: usize,
    /// The buffer's size.
    pub bytes: u64,
    /// Bytes of the piece before the buffer.
    pub lead: u64,
    /// Size of the piece (at least `lead + bytes`).
    pub span: u64,
}

/// The shape of a view: `members` slots of `stride` bytes, each buffer `lead` bytes into its
/// slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub members: usize,
    pub stride: u64,
    pub lead: u64,
}

impl Layout {
    /// Bytes to reserve for the whole view.
    pub fn reserved_bytes(&self) -> u64 {
        self.stride * self.members as u64
    }

    /// Offset of member `i`'s slot from the start of the reserved range.
    pub fn slot(&self, i: usize) -> u64 {
        self.stride * i as u64
    }
}

/// `x` rounded up to a multiple of `granularity` (a power of two or not); `None` on overflow.
pub fn round_up(x: u64, granularity: u64) -> Option<u64> {
    let g = granularity.max(1);
    x.checked_add(g - 1).map(|v| v / g * g)
}

/// The layout of a view of `extents` (in member order) at `granularity`; `InvalidArgument`
/// naming the members whose size or lead differs from the others'.
pub fn plan(extents: &[Extent], granularity: u64) -> Result<Layout> {
    let first = extents
        .first()
        .ok_or_else(|| Error::invalid("a contiguous view needs at least one member"))?;
    if let Some(diff) = differing(extents, |e| e.bytes) {
        return Err(Error::invalid(format!(
            "contiguous view: the members' buffers differ in size ({diff}); every member must \
             give a buffer of the same size"
        )));
    }
    if let Some(diff) = differing(extents, |e| e.lead) {
        return Err(Error::invalid(format!(
            "contiguous view: the members' buffers lie at different offsets in their allocation \
             granules of {granularity} bytes (offset {diff}); allocate every member's buffer \
             alike (same size, same alignment)"
        )));
    }
    if let Some(bad) = extents
        .iter()
        .find(|e| e.lead.checked_add(e.bytes).map_or(true, |end| end > e.span))
    {
        return Err(Error::internal(format!(
            "contiguous view: rank {}'s buffer ({} bytes at {}) does not fit its mapped piece of \
             {} bytes",
            bad.rank, bad.bytes, bad.lead, bad.span
        )));
    }
    let widest = extents.iter().map(|e| e.span).max().unwrap_or(0);
    let stride = round_up(widest, granularity)
        .filter(|&s| s > 0)
        .filter(|&s| s.checked_mul(extents.len() as u64).is_some())
        .ok_or_else(|| {
            Error::invalid(format!(
                "contiguous view: {} members of {widest} bytes do not fit the address space",
                extents.len()
            ))
        })?;
    Ok(Layout {
        members: extents.len(),
        stride,
        lead: first.lead,
    })
}

/// When `value` is not the same for every extent: "ranks 0, 1: 4096; rank 2: 8192", the most
/// common value first.
fn differing(extents: &[Extent], value: impl Fn(&Extent) -> u64) -> Option<String> {
    let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for e in extents {
        groups.entry(value(e)).or_default().push(e.rank);
    }
    if groups.len() < 2 {
        return None;
    }
    let mut groups: Vec<(u64, Vec<usize>)> = groups.into_iter().collect();
    // Most members first; ties by value.
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = groups
        .iter()
        .map(|(v, ranks)| {
            let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{noun} {}: {v}", list.join(", "))
        })
        .collect();
    Some(parts.join("; "))
}

/// A contiguous view mapped in this process; dropping it unmaps every piece and frees the
/// reserved range (the members' buffers themselves are not touched).
pub trait ContiguousView: Send + Sync {
    /// Member 0's buffer in the view.
    fn base(&self) -> u64;
    /// Distance between two members' buffers.
    fn stride(&self) -> u64;
}

#[cfg(test)]
mod tests {
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
}
