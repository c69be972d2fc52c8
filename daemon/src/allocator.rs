//! How the daemons' memory allocator hands freed memory back to the system.
//!
//! glibc's malloc raises its mmap threshold, by default, to the size of each large block it
//! frees (up to 32 MiB), and its trim threshold to twice that. That saves repeated mappings
//! for a program that keeps making buffers of one size, but in a daemon it pins memory: once a
//! 15 MiB block (a memory pool, a large message) has been freed, every later block below that
//! size is carved from a per-thread arena, and an arena keeps up to twice that free. The soak
//! (BENCHMARKS.md) saw each miner's resident size climb in steps of such blocks, one arena at a
//! time, long past warm-up.
//!
//! Fixing the threshold turns that adjustment off: a block of [`MAP_FROM_BYTES`] or more is
//! always a mapping of its own, returned when freed, and an arena gives back its free top
//! beyond glibc's default trim threshold (128 KiB). Smaller blocks (a CPU miner's matrices up
//! to n = 2048, each GEMM step's packed operand) still come from the arenas' free lists,
//! so no step of the work pays for a fresh mapping and its page faults.
//!
//! That leaves the blocks below the threshold. An arena gives memory back only from its top, so
//! a round's freed blocks that lie below one still held (a kept commitment, a connection's
//! buffer) stay resident until the arena reuses them, and which arena a thread gets varies from
//! round to round. [`release_free_memory`] hands back every free page of every arena; a daemon
//! calls it when its work goes idle.
//!
//! Other allocators (musl, jemalloc) decide for themselves; this changes nothing there.

/// The size from which a block is always mapped on its own: above a 2048 x 2048 int8 matrix
/// (4 MiB), so the CPU kernels' per-step buffers stay in the arenas up to that size. At
/// n = 4096 (a CPU validator re-executing a GPU chain) each step's 16 MiB packed operand is
/// mapped afresh: its page faults are a few milliseconds beside a step of tens, the price of
/// not keeping it.
pub const MAP_FROM_BYTES: usize = 8 << 20;

/// Makes the allocator give large freed blocks straight back (see the module). Call it first
/// thing in `main`, before threads start. Returns whether the allocator took the setting:
/// false where it is not glibc's, or glibc refused.
pub fn return_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a tuning parameter of the allocator; it is thread-safe in
        // glibc and takes effect for later allocations.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MAP_FROM_BYTES as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Hands every whole free page in the allocator's arenas back to the system (glibc's
/// `malloc_trim`), wherever it lies in its arena. It walks every arena under its lock (0.4 ms
/// over 28 MiB in `host_memory`'s test), so call it when work has gone idle, not per request.
/// Returns whether any memory was released: false where the allocator is not glibc's.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes each arena's lock itself and only releases pages of free
        // chunks; it is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
