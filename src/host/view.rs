//! Contiguous views of host buffers (see `transport::view`): each member's file is mapped
//! again, at page granularity, into one reserved range, so only the pages that hold its buffer
//! are mapped and the buffers line up whenever they have the same size and the same offset in
//! their page.

use crate::error::{Error, Result};
use crate::os::mmap::{page_size, ReservedRange};
use crate::transport::view::{plan, ContiguousView, Extent, Layout};
use std::os::fd::{AsFd, OwnedFd};

/// One member as the host transport found it: the descriptor of its buffer's file and where the
/// buffer lies in that file.
pub struct HostMember {
    pub rank: usize,
    pub fd: OwnedFd,
    /// Offset of the buffer in its file.
    pub offset: u64,
    pub bytes: u64,
}

/// A host view; dropping it unmaps it.
pub struct HostView {
    range: ReservedRange,
    layout: Layout,
}

impl HostView {
    /// Maps `members` (in the view's order) into one reserved range.
    pub fn map(members: &[HostMember]) -> Result<HostView> {
        let page = page_size();
        let extents: Vec<Extent> = members
            .iter()
            .map(|m| extent(m.rank, m.offset, m.bytes, page))
            .collect::<Result<_>>()?;
        let layout = plan(&extents, page)?;
        let range = ReservedRange::reserve(layout.reserved_bytes())?;
        for (i, (m, e)) in members.iter().zip(&extents).enumerate() {
            let what = format!("the host buffer of rank {}", m.rank);
            range.map_file(
                layout.slot(i),
                m.fd.as_fd(),
                m.offset - e.lead,
                e.span,
                &what,
            )?;
        }
        Ok(HostView { range, layout })
    }
}

/// The piece of a file mapped for a buffer of `bytes` at `offset`: the pages that hold it.
fn extent(rank: usize, offset: u64, bytes: u64, page: u64) -> Result<Extent> {
    let lead = offset % page;
    let span = crate::transport::view::round_up(lead + bytes, page).ok_or_else(|| {
        Error::invalid(format!(
            "rank {rank}'s host buffer of {bytes} bytes is too large"
        ))
    })?;
    Ok(Extent {
        rank,
        bytes,
        lead,
        span,
    })
}

impl ContiguousView for HostView {
    fn base(&self) -> u64 {
        self.range.addr() + self.layout.lead
    }

    fn stride(&self) -> u64 {
        self.layout.stride
    }
}

#[cfg(test)]
mod tests;
