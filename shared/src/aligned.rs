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
#[derive(Clone)]
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    /// `len` zeroed bytes, or `None` when the allocator cannot give them: for buffers sized
    /// from a claim (a memory pool), where running out is an answer, not a crash.
    ///
    /// On Linux the buffer asks for transparent huge pages before it is touched: a memory walk
    /// reads 64 KiB at random places, and with 4 KiB pages each read crosses 16 pages, each a
    /// TLB miss where the CPU's prefetchers stop.
    pub fn try_zeroed(len: usize) -> Option<Self> {
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(len.div_ceil(64)).ok()?;
        #[cfg(target_os = "linux")]
        if len >= 1 << 21 {
            // SAFETY: the range is the vector's own allocation (capacity, not yet initialised);
            // madvise only advises, and a failure (no THP support) changes nothing but speed.
            unsafe {
                libc::madvise(lines.as_mut_ptr().cast(), lines.capacity() * 64, libc::MADV_HUGEPAGE);
            }
        }
        lines.resize(len.div_ceil(64), Line([0; 64]));
        Some(AlignedBytes { lines, len })
    }

    /// `lines * 64` bytes, line i being `line(i)`: for rearranging data without first zeroing
    /// the destination (a measurable share of a small GEMM).
    pub fn from_lines(lines: usize, line: impl FnMut(usize) -> [u8; 64]) -> Self {
        AlignedBytes {
            lines: (0..lines).map(line).map(Line).collect(),
            len: lines * 64,
        }
    }

    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut out = Self::zeroed(bytes.len());
        out.as_mut_slice().copy_from_slice(bytes);
        out
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
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
}
