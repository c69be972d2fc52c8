//! Buffers a product's tasks lay out their rows of A in, kept from one product to the next.
//!
//! A chain runs thousands of products of one size. Each task rearranges its rows of A for its
//! kernel; into a fresh allocation, every 4 KiB of that copy was a page fault (279 000 in a
//! two-second AMX bench at n = 2048, about a tenth of the step), and a large allocation goes
//! back to the kernel when it is freed, so the next product faults it in again.

use crate::aligned::AlignedBytes;
use std::sync::{Mutex, PoisonError};

/// The idle buffers. A task takes one for as long as it runs; at most one a running task, so
/// the pool holds as many buffers as tasks ever ran at once (the engine's threads), each the
/// size of the largest rows it was given. With four tasks a thread that is about a quarter of
/// A's rearranged size in all (n^2 / 4 bytes, twice that for AVX2's i16 layout: 16 MiB at
/// n = 8192), kept for the engine's life.
#[derive(Default)]
pub(super) struct ScratchPool(Mutex<Vec<AlignedBytes>>);

impl ScratchPool {
    /// A buffer for one task, given back when the lease is dropped (also when the task stops
    /// early or panics).
    pub(super) fn take(&self) -> ScratchLease<'_> {
        let buffer = self.idle().pop().unwrap_or_else(|| AlignedBytes::zeroed(0));
        ScratchLease { pool: self, buffer }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<AlignedBytes>> {
        // A panic elsewhere leaves the list whole: pushes and pops do not panic midway.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) struct ScratchLease<'p> {
    pool: &'p ScratchPool,
    buffer: AlignedBytes,
}

impl ScratchLease<'_> {
    pub(super) fn buffer(&mut self) -> &mut AlignedBytes {
        &mut self.buffer
    }
}

impl Drop for ScratchLease<'_> {
    fn drop(&mut self) {
        let buffer = std::mem::replace(&mut self.buffer, AlignedBytes::zeroed(0));
        self.pool.idle().push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer given back is the one the next task gets, its memory kept; two tasks at once
    /// get two buffers.
    #[test]
    fn buffers_come_back_and_are_reused() {
        let pool = ScratchPool::default();
        let first_address = {
            let mut lease = pool.take();
            lease.buffer().reuse(4096).as_ptr() as usize
        };
        let mut again = pool.take();
        assert_eq!(again.buffer().reuse(4096).as_ptr() as usize, first_address);
        let mut other = pool.take();
        assert_ne!(other.buffer().reuse(4096).as_ptr() as usize, first_address);
        drop((again, other));
        assert_eq!(pool.idle().len(), 2);
    }
}
