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
