// A model of the AMX kernel's walk on one core, in C, so that each cost of the engine's product
// can be switched on alone: the k-step loop (shared/src/gemm/kernels/amx), the working set of a
// real product (each task packs its rows of A from the previous product's output, and the
// output alternates between two buffers, as a chain's matrices do), and the side work between
// k-steps (the previous tile's `mix`, some rows of it after each k-step).
//
// The walk is the driver's (shared/src/gemm/mod.rs) at one pass over k: per task, panels of B
// outer, strips of 32 rows inner; each tile is four tdpbssd per 64 of k on a 2x2 block of tiles,
// A loaded with the T1 hint, B without, the sums stored at the tile's end. The mix is PROTOCOL.md's
// up to its keys (the same instructions: xor, shift, xor, multiply, shift, narrow and store).
//
// Build: gcc -O2 -mamx-tile -mamx-int8 -mavx512f -mavx512bw -o amx-loop-model amx_loop_model.c
// Usage: amx-loop-model N STRIPS TASKS SIDE ROWS [SECONDS]
//   N        matrix size, a multiple of 64 (1024)
//   STRIPS   strips of 32 rows a task (8: the engine's tasks on one thread at n = 1024)
//   TASKS    tasks a product (4); TASKS * STRIPS * 32 = N for a whole product
//   SIDE     none | mix | mix-l1 (the same mix, written to a 1 KiB buffer that stays in L1) |
//            prefetch-a (prefetcht0 of A's lines two k-steps ahead, nothing mixed)
//   ROWS     rows of the previous tile mixed after each k-step, at least 32 / (N / 64) so that
//            every row is mixed within the tile (the first slots take them, the rest none)
// Output: `n strips tasks side rows TOPS share`, share against tdpbssd on tiles that never touch
// memory, timed in the same process (the engine's register-only ceiling). Run it on one core;
// the guest's speed drifts, so compare only settings run interleaved (docs/benchmarks).

#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum side { SIDE_NONE, SIDE_MIX, SIDE_MIX_L1, SIDE_PREFETCH_A };

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int8_t small_out[32 * 32] __attribute__((aligned(64)));

// Rows r0..r1 of a finished 32x32 tile of sums, mixed into int8 at `out` (row stride n).
__attribute__((noinline)) static void mix_rows(const int32_t *tile, int r0, int r1, int8_t *out, size_t n) {
    const __m512i multiplier = _mm512_set1_epi32(0x7FEB352D);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i col0 = _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int)0x85EBCA6Bu));
    const __m512i col1 = _mm512_add_epi32(col0, _mm512_set1_epi32((int)(16 * 0x85EBCA6Bu)));
    for (int r = r0; r < r1; r++) {
        const __m512i row_key = _mm512_set1_epi32((int)((uint32_t)r << 16) * (int)0x85EBCA6Bu);
        for (int half = 0; half < 2; half++) {
            __m512i x = _mm512_loadu_si512(tile + r * 32 + half * 16);
            x = _mm512_xor_si512(x, _mm512_add_epi32(row_key, half ? col1 : col0));
            x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
            x = _mm512_mullo_epi32(x, multiplier);
            x = _mm512_srli_epi32(x, 24);
            _mm_storeu_si128((__m128i *)(out + (size_t)r * n + half * 16), _mm512_cvtepi32_epi8(x));
        }
    }
}

// One 32x32 tile over the whole of k: A one packed strip (k-blocks of 32 rows x 64 bytes), B one
// panel (k-quads of 32 lanes x 4 bytes); side work from the previous tile after each k-step.
static void tile(const uint8_t *a, const uint8_t *b, int32_t *sums, size_t n, enum side side, int rows,
                 const int32_t *previous, int8_t *previous_out) {
    const int steps = (int)(n / 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int s = 0; s < steps; s++) {
        const uint8_t *as = a + (size_t)s * 2048, *bs = b + (size_t)s * 2048;
        _tile_stream_loadd(4, as, 64);
        _tile_loadd(6, bs, 128);
        _tile_dpbssd(0, 4, 6);
        _tile_loadd(7, bs + 64, 128);
        _tile_dpbssd(1, 4, 7);
        _tile_stream_loadd(5, as + 1024, 64);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
        if (side == SIDE_PREFETCH_A && s + 2 < steps) {
            for (int line = 0; line < 32; line++) _mm_prefetch((const char *)as + 2 * 2048 + line * 64, _MM_HINT_T0);
        }
        if (previous && (side == SIDE_MIX || side == SIDE_MIX_L1) && s * rows < 32) {
            const int end = s * rows + rows < 32 ? s * rows + rows : 32;
            if (side == SIDE_MIX) mix_rows(previous, s * rows, end, previous_out, n);
            else mix_rows(previous, s * rows, end, small_out, 32);
        }
    }
    _tile_stored(0, sums, 128);
    _tile_stored(1, sums + 16, 128);
    _tile_stored(2, sums + 512, 128);
    _tile_stored(3, sums + 512 + 16, 128);
}

// tdpbssd on tiles that never touch memory: the unit's limit, in TOPS, on this core.
static double register_peak(double seconds) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    long rounds = 0;
    const double t0 = now();
    double t;
    do {
        for (int i = 0; i < 1024; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
        rounds++;
        t = now();
    } while (t - t0 < seconds);
    return (double)rounds * 1024 * 4 * 16 * 16 * 64 * 2 / (t - t0) / 1e12;
}

static int usage(void) {
    fprintf(stderr, "usage: amx-loop-model N STRIPS TASKS none|mix|mix-l1|prefetch-a ROWS [SECONDS]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 6) return usage();
    const size_t n = strtoul(argv[1], NULL, 10);
    const int strips = atoi(argv[2]), tasks = atoi(argv[3]), rows = atoi(argv[5]);
    const double seconds = argc > 6 ? atof(argv[6]) : 1.0;
    enum side side;
    if (!strcmp(argv[4], "none")) side = SIDE_NONE;
    else if (!strcmp(argv[4], "mix")) side = SIDE_MIX;
    else if (!strcmp(argv[4], "mix-l1")) side = SIDE_MIX_L1;
    else if (!strcmp(argv[4], "prefetch-a")) side = SIDE_PREFETCH_A;
    else return usage();
    if (n < 64 || n % 64 || strips < 1 || tasks < 1 || rows < 1 || rows > 32) return usage();
    // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        fprintf(stderr, "amx-loop-model: the kernel refused the AMX tile state\n");
        return 2;
    }
    struct tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int i = 0; i < 8; i++) {
        config.colsb[i] = 64;
        config.rows[i] = 16;
    }
    _tile_loadconfig(&config);

    const size_t task_bytes = (size_t)strips * 32 * n, product_bytes = task_bytes * tasks;
    uint8_t *packed = aligned_alloc(4096, task_bytes), *b = aligned_alloc(4096, n * n);
    int8_t *outputs = aligned_alloc(4096, 2 * product_bytes);
    int32_t *sums = aligned_alloc(4096, 2 * 32 * 32 * sizeof(int32_t));
    if (!packed || !b || !outputs || !sums) return 2;
    for (size_t i = 0; i < n * n; i++) b[i] = (uint8_t)(i * 91);
    for (size_t i = 0; i < 2 * product_bytes; i++) outputs[i] = (int8_t)(i * 37);
    memset(sums, 0, 2 * 32 * 32 * sizeof(int32_t));

    const int steps = (int)(n / 64);
    const int rows_a_slot = rows > (32 + steps - 1) / steps ? rows : (32 + steps - 1) / steps;
    const double peak = register_peak(0.3);
    long tiles = 0, products = 0;
    const double t0 = now();
    double t;
    do {
        // Each product reads the previous one's output as its A and writes the other buffer.
        const int8_t *x = outputs + (products & 1) * product_bytes;
        int8_t *out = outputs + ((products + 1) & 1) * product_bytes;
        for (int task = 0; task < tasks; task++) {
            const int8_t *rows_of_a = x + (size_t)task * task_bytes;
            uint8_t *line = packed;
            for (int strip = 0; strip < strips; strip++)
                for (size_t kb = 0; kb < n / 64; kb++)
                    for (int r = 0; r < 32; r++, line += 64)
                        memcpy(line, rows_of_a + ((size_t)strip * 32 + r) * n + kb * 64, 64);
            int8_t *task_out = out + (size_t)task * task_bytes;
            const int32_t *previous = NULL;
            int8_t *previous_out = NULL;
            for (size_t panel = 0; panel < n / 32; panel++) {
                for (int strip = 0; strip < strips; strip++) {
                    int32_t *these = sums + (tiles & 1) * 1024;
                    tile(packed + (size_t)strip * 32 * n, b + panel * 32 * n, these, n, side, rows_a_slot, previous,
                         previous_out);
                    previous = these;
                    previous_out = task_out + (size_t)strip * 32 * n + panel * 32;
                    tiles++;
                }
            }
            if (previous && side == SIDE_MIX) mix_rows(previous, 0, 32, previous_out, n);
        }
        products++;
        t = now();
    } while (t - t0 < seconds);
    _tile_release();
    const double tops = (double)tiles * 32 * 32 * n * 2 / (t - t0) / 1e12;
    printf("%zu %d %d %s %d %.3f %.1f%%\n", n, strips, tasks, argv[4], rows_a_slot, tops, 100 * tops / peak);
    return 0;
}
