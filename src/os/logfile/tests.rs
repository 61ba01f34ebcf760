use super::*;
use std::io::Write;

fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("nvfipc-logfile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn creates_new_files_0600_and_appends_to_existing_ones() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("a");
    let p = d.join("new.log");
    let path = p.to_str().unwrap();
    open_append(path).unwrap().write_all(b"one\n").unwrap();
    let mode = std::fs::metadata(&p).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    open_append(path).unwrap().write_all(b"two\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn refuses_links_directories_and_fifos_without_blocking() {
    let d = dir("b");
    let target = d.join("target");
    let link = d.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = open_append(link.to_str().unwrap()).unwrap_err();
    assert!(err.0.contains("symbolic link"), "{err:?}");
    assert!(!target.exists(), "the link's target was created");
    std::fs::write(&target, "x").unwrap();
    let err = open_append(link.to_str().unwrap()).unwrap_err();
    assert!(err.0.contains("symbolic link"), "{err:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
    let err = open_append(d.to_str().unwrap()).unwrap_err();
    assert!(err.0.contains("directory"), "{err:?}");
    let fifo = CString::new(d.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: `fifo` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let err = open_append(fifo.to_str().unwrap()).unwrap_err();
    assert!(err.0.contains("FIFO"), "{err:?}");
    let err = open_append("/dev/null").unwrap_err();
    assert!(err.0.contains("not a terminal"), "{err:?}");
    let _ = std::fs::remove_dir_all(&d);
}
