use super::*;
use crate::os::memfd;

#[test]
fn a_file_mapped_twice_into_a_range_shows_the_same_bytes() {
    let page = page_size();
    let file = memfd::create_mapped("unit-vrange", 3 * page).unwrap();
    let range = MappedRange::reserve(4 * page).unwrap();
    range
        .map_file(0, file.fd(), page, page, "unit-vrange")
        .unwrap();
    range
        .map_file(2 * page, file.fd(), 0, 2 * page, "unit-vrange")
        .unwrap();
    // SAFETY: the file's pages are mapped at both places in the range and in `file`.
    unsafe {
        *((file.addr() + page + 8) as *mut u32) = 0xabcd_0123;
        assert_eq!(*((range.addr() + 8) as *const u32), 0xabcd_0123);
        assert_eq!(*((range.addr() + 3 * page + 8) as *const u32), 0xabcd_0123);
        *((range.addr() + 2 * page) as *mut u32) = 7;
        assert_eq!(*(file.addr() as *const u32), 7);
    }
    assert!(range
        .map_file(3 * page, file.fd(), 0, 2 * page, "x")
        .is_err());
    assert!(MappedRange::reserve(0).is_err());
}
