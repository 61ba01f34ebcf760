//! Returning the allocator's free memory to the system after a burst of large replies.

/// Returns glibc's free heap memory to the system (after a server's large replies).
pub(super) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it walks the allocator's own free lists under the
    // allocator's locks and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
