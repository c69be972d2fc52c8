//! Byte buffers that start on a cache line.
//!
//! The CPU kernels read matrices in 64-byte rows (an AMX tile row, a zmm register). From a
//! plain `Vec<u8>`, which the allocator aligns to 16 bytes, every such read straddles two cache
//! lines and costs two; measured on the AMX kernel this halved its speed. So matrices and packed
//! panels live in whole cache lines.

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: a 64-byte array with alignment 64 has no padding, and every bit pattern is valid.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Line` is `Copy` and `repr(C)`.
unsafe impl bytemuck::Pod for Line {}

/// `len` bytes, zero-initialised, starting on a 64-byte boundary.
pub struct AlignedBytes {
    lines: Lines,
    len: usize,
}

/// Where the lines live: on the heap for a matrix or a panel, in a mapping of their own for a
/// buffer sized from a claim (see [`AlignedBytes::try_zeroed`]).
enum Lines {
    Heap(Vec<Line>),
    #[cfg(target_os = "linux")]
    Mapped(mapping::Mapping),
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            lines: Lines::Heap(vec![Line([0; 64]); len.div_ceil(64)]),
            len,
        }
    }

    /// `len` zeroed bytes, or `None` when the memory cannot be had: for buffers sized from a
    /// claim (a memory pool), where running out is an answer, not a crash.
    ///
    /// On Linux a buffer of 2 MiB or more is a mapping of its own, unmapped when it is dropped.
    /// From the allocator it would not go back: once glibc has given back one large block it
    /// raises its mmap threshold to that block's size, so the next pool of that size comes from
    /// a per-thread arena, which keeps it after it is freed. A miner making a pool per round on
    /// whichever thread then grew by a pool per thread (BENCHMARKS.md, the soak).
    ///
    /// The mapping also asks for transparent huge pages before it is touched: a memory walk
    /// reads 64 KiB at random places, and with 4 KiB pages each read crosses 16 pages, each a
    /// TLB miss where the CPU's prefetchers stop.
    pub fn try_zeroed(len: usize) -> Option<Self> {
        #[cfg(target_os = "linux")]
        if len >= mapping::MIN_BYTES {
            let lines = mapping::Mapping::zeroed(len.div_ceil(64))?;
            return Some(AlignedBytes {
                lines: Lines::Mapped(lines),
                len,
            });
        }
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(len.div_ceil(64)).ok()?;
        lines.resize(len.div_ceil(64), Line([0; 64]));
        Some(AlignedBytes {
            lines: Lines::Heap(lines),
            len,
        })
    }

    /// `lines * 64` bytes, line i being `line(i)`: for rearranging data without first zeroing
    /// the destination (a measurable share of a small GEMM).
    pub fn from_lines(lines: usize, line: impl FnMut(usize) -> [u8; 64]) -> Self {
        AlignedBytes {
            lines: Lines::Heap((0..lines).map(line).map(Line).collect()),
            len: lines * 64,
        }
    }

    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut out = Self::zeroed(bytes.len());
        out.as_mut_slice().copy_from_slice(bytes);
        out
    }

    /// `len` bytes of this buffer, to be overwritten whole: a scratch buffer rebuilt for every
    /// product. The lines it already has are kept (their old bytes show until overwritten), so
    /// that a buffer reused at the same size is neither allocated nor faulted in again: a fresh
    /// allocation per product cost the AMX kernel a page fault every 4 KiB, 279 000 of them
    /// in a two-second bench at n = 2048.
    pub fn reuse(&mut self, len: usize) -> &mut [u8] {
        let lines = len.div_ceil(64);
        match &mut self.lines {
            Lines::Heap(heap) => heap.resize(lines, Line([0; 64])),
            #[cfg(target_os = "linux")]
            Lines::Mapped(mapping) if mapping.lines().len() >= lines => {}
            #[cfg(target_os = "linux")]
            Lines::Mapped(_) => self.lines = Lines::Heap(vec![Line([0; 64]); lines]),
        }
        self.len = len;
        self.as_mut_slice()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(self.lines())[..self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut(self.lines_mut())[..len]
    }

    fn lines(&self) -> &[Line] {
        match &self.lines {
            Lines::Heap(lines) => lines,
            #[cfg(target_os = "linux")]
            Lines::Mapped(mapping) => mapping.lines(),
        }
    }

    fn lines_mut(&mut self) -> &mut [Line] {
        match &mut self.lines {
            Lines::Heap(lines) => lines,
            #[cfg(target_os = "linux")]
            Lines::Mapped(mapping) => mapping.lines_mut(),
        }
    }
}

impl Clone for AlignedBytes {
    /// A copy held the same way as the original: a mapped buffer's copy is mapped too, so that
    /// it is also given back when dropped. Where no mapping can be had the copy goes on the
    /// heap, whose allocation fails as `Vec::clone`'s does.
    fn clone(&self) -> Self {
        match &self.lines {
            Lines::Heap(lines) => AlignedBytes {
                lines: Lines::Heap(lines.clone()),
                len: self.len,
            },
            #[cfg(target_os = "linux")]
            Lines::Mapped(_) => {
                let mut copy = AlignedBytes::try_zeroed(self.len).unwrap_or_else(|| AlignedBytes::zeroed(self.len));
                copy.as_mut_slice().copy_from_slice(self.as_slice());
                copy
            }
        }
    }
}

/// Anonymous private mappings, each a whole buffer's lines.
#[cfg(target_os = "linux")]
mod mapping {
    use super::Line;
    use std::ptr::NonNull;

    /// The size from which a buffer is mapped rather than allocated: one huge page. A smaller
    /// buffer would gain nothing from huge pages and stays with the allocator.
    pub(super) const MIN_BYTES: usize = 1 << 21;

    /// `lines` cache lines, page-aligned, owned: unmapped on drop.
    pub(super) struct Mapping {
        start: NonNull<Line>,
        lines: usize,
    }

    // SAFETY: the mapping is owned by this value alone (like a `Vec<Line>`'s buffer); shared
    // access is through `&self` and mutation through `&mut self`.
    unsafe impl Send for Mapping {}
    // SAFETY: as above; `&Mapping` gives only `&[Line]`.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// A fresh mapping of `lines` lines, which the kernel zero-fills on first touch; `None`
        /// when the kernel refuses it.
        pub(super) fn zeroed(lines: usize) -> Option<Self> {
            let bytes = lines.checked_mul(64)?;
            if bytes == 0 {
                return None;
            }
            // SAFETY: an anonymous private mapping at an address the kernel picks touches no
            // existing memory; the result is checked before use.
            let start = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if start == libc::MAP_FAILED {
                return None;
            }
            // SAFETY: the range is the mapping just made; madvise only advises, and a failure
            // (no THP support) changes nothing but speed.
            unsafe {
                libc::madvise(start, bytes, libc::MADV_HUGEPAGE);
            }
            // A mapping starts on a page, so on a cache line; it is never at address 0.
            Some(Mapping {
                start: NonNull::new(start.cast::<Line>())?,
                lines,
            })
        }

        pub(super) fn lines(&self) -> &[Line] {
            // SAFETY: `start` maps `lines` lines, readable, zero-filled or written since, for
            // as long as `self` lives; any bit pattern is a valid `Line`.
            unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.lines) }
        }

        pub(super) fn lines_mut(&mut self) -> &mut [Line] {
            // SAFETY: as in `lines`, and `&mut self` makes this the only reference.
            unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.lines) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the range is this value's own mapping, and no slice of it outlives
            // `self`. munmap of an owned, valid range cannot fail in a way to act on here.
            unsafe {
                libc::munmap(self.start.as_ptr().cast(), self.lines * 64);
            }
        }
    }
}

impl PartialEq for AlignedBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for AlignedBytes {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_cache_line_and_keeps_its_length() {
        for len in [0, 1, 63, 64, 65, 4096 + 7] {
            let mut b = AlignedBytes::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert!((b.as_slice().as_ptr() as usize).is_multiple_of(64));
            b.as_mut_slice().iter_mut().enumerate().for_each(|(i, v)| *v = i as u8);
            let c = AlignedBytes::from_slice(b.as_slice());
            assert!(c == b && (c.as_slice().as_ptr() as usize).is_multiple_of(64));
            let d = AlignedBytes::from_lines(len / 64, |i| [i as u8; 64]);
            assert_eq!(d.len(), len / 64 * 64);
            assert!(
                d.as_slice()
                    .chunks(64)
                    .enumerate()
                    .all(|(i, l)| l.iter().all(|&v| v == i as u8))
            );
        }
    }

    #[test]
    fn a_claim_sized_buffer_is_zeroed_aligned_sized_and_copied_whole() {
        for len in [(1 << 21) - 64, 1 << 21, (1 << 21) + 1, (15 << 20) + 64 * 3 + 5] {
            let mut b = AlignedBytes::try_zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!((b.as_slice().as_ptr() as usize).is_multiple_of(64));
            assert!(b.as_slice().iter().all(|&v| v == 0));
            b.as_mut_slice()[0] = 1;
            b.as_mut_slice()[len - 1] = 7;
            let copy = b.clone();
            assert!(copy == b && copy.as_slice()[len - 1] == 7);
            drop(b);
            assert_eq!(copy.as_slice()[0], 1, "a copy outlives its original");
        }
    }
}
