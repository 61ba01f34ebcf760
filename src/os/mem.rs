//! Heap memory handed back to the system after large frees.

/// Returns the allocator's free memory (at the top of each heap and whole free pages inside it,
/// in every arena) to the system: glibc keeps freed memory for reuse, so a server that held
/// large replies for many clients would otherwise stay that large after they left. Does nothing
/// on other C libraries.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it walks the allocator's own free lists under the
    // allocator's locks and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
