//! Contiguous views of a symmetric allocation: every member's buffer mapped again, in rank order,
//! in one reserved range, member i's buffer at `base + i * stride` (the layout: PROTOCOL.md section
//! 5, "Symmetric memory"). The arithmetic, [`plan`] (which names the members whose size or lead
//! differ) and the view are here; what is mapped where is the transport's
//! ([`Transport::contiguous_view`](super::Transport::contiguous_view)).

use super::record::Record;
use super::{LocalBuffer, PeerMapping};
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
        mapping: &'a PeerMapping,
    },
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

/// The shape of a view: `members` slots of `stride` bytes, each buffer `lead` bytes into its slot.
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

/// A contiguous view mapped in this process, member i's buffer at `base() + i * stride()`;
/// dropping it drops the transport's backing, which unmaps every slot and frees the range.
pub struct ContiguousView {
    start: u64,
    layout: Layout,
    _backing: Box<dyn Send + Sync>,
}

impl ContiguousView {
    /// The view of `layout` in the range at `start` that `backing` holds mapped.
    pub fn new(start: u64, layout: Layout, backing: impl Send + Sync + 'static) -> ContiguousView {
        ContiguousView {
            start,
            layout,
            _backing: Box::new(backing),
        }
    }

    /// Member 0's buffer in the view.
    pub fn base(&self) -> u64 {
        self.start + self.layout.lead
    }

    /// Distance between two members' buffers.
    pub fn stride(&self) -> u64 {
        self.layout.stride
    }
}

#[cfg(test)]
mod tests;
