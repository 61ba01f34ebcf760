//! Contiguous views of host buffers (see `transport::view`): each member's file is mapped
//! again, at page granularity, into one reserved range, so only the pages that hold its buffer
//! are mapped and the buffers line up whenever they have the same size and the same offset in
//! their page.

use crate::error::{Error, Result};
use crate::os::vrange::{page_size, ReservedRange};
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
mod tests {
    use super::*;
    use crate::os::memfd;

    #[test]
    fn buffers_at_the_same_place_of_their_page_line_up() {
        let page = page_size();
        let files: Vec<_> = (0..3)
            .map(|_| memfd::create_mapped("unit-hostview", 3 * page).unwrap())
            .collect();
        let offset = page + 24;
        let members: Vec<HostMember> = files
            .iter()
            .enumerate()
            .map(|(rank, f)| HostMember {
                rank,
                fd: f.fd().try_clone_to_owned().unwrap(),
                offset,
                bytes: page,
            })
            .collect();
        for (rank, f) in files.iter().enumerate() {
            // SAFETY: [offset, + page) lies inside the 3-page mapping.
            unsafe {
                std::ptr::write_bytes(
                    (f.addr() + offset) as *mut u8,
                    rank as u8 + 1,
                    page as usize,
                )
            };
        }
        let view = HostView::map(&members).unwrap();
        assert_eq!(view.stride(), 2 * page, "a page crossing buffer takes two");
        assert_eq!(view.base() % page, 24);
        for rank in 0..3 {
            let at = view.base() + rank as u64 * view.stride();
            // SAFETY: the view maps each member's buffer at `at`.
            let got = unsafe { std::slice::from_raw_parts(at as *const u8, page as usize) };
            assert!(got.iter().all(|&b| b == rank as u8 + 1), "member {rank}");
        }
        let mut other = members;
        other[1].offset = 16;
        let err = HostView::map(&other).err().unwrap();
        assert!(err.message.contains("rank 1: 16"), "{err}");
    }
}
