//! Buffers for weights and the KV cache on the CPU, on transparent huge
//! pages where the system allows them.
//!
//! A decode step streams every weight of the model from memory, and the
//! attention reads each sequence's KV blocks wherever they lie in the pool.
//! On 4 KiB pages that is a page-table walk per 4 KiB, and a 16-row matrix
//! product (which prefetches a block ahead of its arithmetic) stalls on
//! them. Most Linux systems leave transparent huge pages to `madvise`
//! (`/sys/kernel/mm/transparent_hugepage/enabled`), so a plain `Vec` or a
//! libtorch tensor does not get them. A buffer of at least 2 MiB here is a
//! fresh anonymous mapping (not heap memory, which may have been faulted in
//! small already), aligned to 2 MiB, its whole 2 MiB pages advised
//! `MADV_HUGEPAGE` before its first touch, so they fault in huge (the tail
//! stays on small pages, so no memory is added). Where the advice is
//! refused (THP `never`, another OS) the buffer works the same on small
//! pages. `GYRE_HUGE_PAGES=0` (or [`set_enabled`]) allocates from the heap
//! as before, for comparisons.

use std::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// The size and alignment of a huge page on x86-64 and aarch64 (with 4 KiB
/// base pages).
const HUGE: usize = 2 << 20;
/// A small page.
const SMALL: usize = 4 << 10;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns huge pages on or off for buffers made later (comparisons).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Not turned off by `GYRE_HUGE_PAGES=0` or [`set_enabled`].
fn enabled() -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ENABLED.load(Ordering::Relaxed)
        && !*ENV_OFF.get_or_init(|| std::env::var("GYRE_HUGE_PAGES").is_ok_and(|v| v == "0"))
}

/// Plain numbers, for which all-zero bytes are a value (0 or 0.0).
pub(crate) trait Zeroable: Copy {}
impl Zeroable for f32 {}
impl Zeroable for u8 {}
impl Zeroable for half::f16 {}

/// A zero-initialised, fixed-length buffer of `T`, on huge pages when at
/// least one fits.
pub(crate) struct Pages<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    mem: Memory,
}

/// Where a buffer's bytes come from.
enum Memory {
    /// The global allocator (small buffers, or where `mmap` failed).
    Heap(Layout),
    /// An anonymous mapping of this many bytes at `ptr` (Linux).
    #[cfg(target_os = "linux")]
    Mapped(usize),
}

// SAFETY: `Pages` owns its allocation like a `Box<[T]>`.
#[allow(unsafe_code)]
unsafe impl<T: Zeroable + Send> Send for Pages<T> {}
// SAFETY: shared access only reads.
#[allow(unsafe_code)]
unsafe impl<T: Zeroable + Sync> Sync for Pages<T> {}

impl<T: Zeroable> Pages<T> {
    /// `len` zeroes of `T`. A huge buffer's pages are faulted in as it is
    /// first written (or read).
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = len.checked_mul(size_of::<T>()).expect("buffer size");
        #[cfg(target_os = "linux")]
        if bytes >= HUGE
            && enabled()
            && let Some((ptr, size)) = map_huge(bytes)
        {
            return Self {
                ptr: ptr.cast(),
                len,
                mem: Memory::Mapped(size),
            };
        }
        let layout =
            Layout::from_size_align(bytes.max(1), align_of::<T>().max(64)).expect("buffer layout");
        #[allow(unsafe_code)]
        // SAFETY: the layout's size is not zero.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        Self {
            ptr: ptr.cast(),
            len,
            mem: Memory::Heap(layout),
        }
    }
}

impl Pages<u8> {
    /// Faults every page of a buffer not yet written in now (one zero
    /// written a small page, where a zero already is), so that nothing
    /// faults on a hot path later.
    pub(crate) fn fault_in(&mut self) {
        let p = self.ptr.as_ptr();
        for at in (0..self.len).step_by(SMALL) {
            #[allow(unsafe_code)]
            // SAFETY: `at < len`, inside the buffer, which `&mut self` holds
            // alone; volatile so that writing the zero already there is not
            // elided.
            unsafe {
                p.add(at).write_volatile(0);
            }
        }
    }
}

/// A fresh anonymous mapping of `bytes` (whole 4 KiB pages), 2 MiB
/// aligned, its whole huge pages advised `MADV_HUGEPAGE` before anything
/// touches them (so they fault in huge, and zeroed). The tail past the last
/// whole huge page stays on small pages: rounding every matrix up to 2 MiB
/// would add up to a sixth to a model like SmolLM2 (2.2 MB projections).
/// Fresh from `mmap` rather than from the allocator, whose heap may hand
/// back pages already faulted in small. None if the mapping fails; a
/// refused advice leaves small pages.
#[cfg(target_os = "linux")]
fn map_huge(bytes: usize) -> Option<(NonNull<u8>, usize)> {
    let size = bytes.next_multiple_of(SMALL);
    // One huge page more, to align the start within.
    let span = size + HUGE;
    #[allow(unsafe_code)]
    // SAFETY: a new private anonymous mapping; it aliases nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE);
    let (head, tail) = (aligned - start, span - (aligned - start) - size);
    #[allow(unsafe_code)]
    // SAFETY: the head and tail are whole small pages of the mapping just
    // made that the buffer will not use; the advice only changes how the
    // kernel backs the rest, which nothing has touched yet.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
        let huge = bytes / HUGE * HUGE;
        if libc::madvise(aligned as *mut libc::c_void, huge, libc::MADV_HUGEPAGE) != 0 {
            tracing::debug!(
                "madvise(MADV_HUGEPAGE) refused: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    NonNull::new(aligned as *mut u8).map(|p| (p, size))
}

impl<T: Zeroable> Drop for Pages<T> {
    fn drop(&mut self) {
        match self.mem {
            #[allow(unsafe_code)]
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            Memory::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr().cast(), layout) },
            #[cfg(target_os = "linux")]
            #[allow(unsafe_code)]
            // SAFETY: the mapping `map_huge` made, unmapped once.
            Memory::Mapped(size) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), size);
            },
        }
    }
}

impl<T: Zeroable> Deref for Pages<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        #[allow(unsafe_code)]
        // SAFETY: `ptr` holds `len` initialised (zeroed, then written) `T`s
        // for the buffer's life.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<T: Zeroable> DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        #[allow(unsafe_code)]
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small and huge buffers start zeroed, hold what is written, and a
    /// huge one is 2 MiB aligned.
    #[test]
    fn zeroed_writable_and_aligned() {
        for len in [0usize, 1, 1000, (HUGE / 4) * 3 + 5] {
            let mut b = Pages::<f32>::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0.0));
            for (i, v) in b.iter_mut().enumerate() {
                *v = i as f32;
            }
            assert!(b.iter().enumerate().all(|(i, &v)| v == i as f32));
            if len * 4 >= HUGE {
                assert_eq!(b.as_ptr() as usize % HUGE, 0);
            }
        }
    }
}
