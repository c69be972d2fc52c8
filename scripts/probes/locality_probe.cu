// What a locality test would rest on, measured on one GPU (docs/design/locality.md): the time of
// one dependent step of a latency-bound walk (`t_l`: read one 256-byte line named by the state,
// mix it into the state across a warp), and what a step costs more when its line lives in host
// memory over the PCIe link (`Delta_host`), and at shares of such remote lines in between.
//
// Each walker is one warp making `steps` dependent steps; a step's line is named by the state the
// previous step produced, so no step can start before the one before it ended. The time of a
// launch is the time of its slowest walker's chain, so t_l = launch time / steps. The walk runs
// with 1 walker, one walker per SM and four per SM (does the latency hold under load?), over a
// device buffer far past L2, then with the load alone (the floor a cheater's faster mixing could
// reach), then over mapped pinned host memory, then over both mixed.
//
// Build: nvcc -O3 -arch=sm_90 -o locality-probe locality_probe.cu   (any sm_70 or later works)
// Usage: locality-probe [DEVICE_GIB] [HOST_GIB] [STEPS]   (defaults 16, 4, 200000)
// Output: one line per measurement, `name walkers steps ms ns_per_step`, then the figures the
// design asks for (the step is docs/design/locality.md's, shared::memory::locality's). Each figure is the best of three launches (the others only warm the clocks).

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                     \
    do {                                                                                \
        cudaError_t err_ = (call);                                                      \
        if (err_ != cudaSuccess) {                                                      \
            fprintf(stderr, "locality-probe: %s: %s\n", #call, cudaGetErrorString(err_)); \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

// A line is 256 bytes: 32 lanes of 8 bytes each, one coalesced load per step.
static const uint64_t LINE_WORDS = 32;

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return x;
}

// The walk. `remote_per_1024` of every 1024 line numbers are read from `remote` (host memory)
// instead of `local`; line numbers are taken modulo each buffer's line count.
__global__ void walk(const uint64_t* __restrict__ local, uint64_t local_lines,
                     const uint64_t* __restrict__ remote, uint64_t remote_lines,
                     uint32_t remote_per_1024, uint32_t steps, bool bare, uint64_t* out) {
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t walker = blockIdx.x;
    // The state: four words, every lane holding all four.
    uint64_t s0 = mix64(walker + 1), s1 = mix64(s0 + 1), s2 = mix64(s1 + 1), s3 = mix64(s2 + 1);
    for (uint32_t t = 0; t < steps; ++t) {
        const uint64_t name = s0;
        const bool far = (name >> 54) % 1024 < remote_per_1024;
        const uint64_t* base = far ? remote : local;
        const uint64_t lines = far ? remote_lines : local_lines;
        const uint64_t line = name % lines;
        // Past L1 (a walk's lines are not reused); the address depends on the last step, so no
        // load can be hoisted out of the chain.
        uint64_t v = __ldcg(base + line * LINE_WORDS + lane);
        if (bare) {
            // The floor a cheater's own kernel could reach: the load alone, its first word
            // naming the next line (one shuffle, no mixing of the rest).
            s0 = mix64(__shfl_sync(0xffffffffu, v, 0) ^ s0);
            continue;
        }
        const uint64_t word = (lane & 3) == 0 ? s0 : (lane & 3) == 1 ? s1 : (lane & 3) == 2 ? s2 : s3;
        uint64_t x = mix64(v ^ word ^ ((uint64_t)lane << 56));
        // Fold the lanes that share a state word (lane & 3), then hand each word to every lane.
        x ^= __shfl_xor_sync(0xffffffffu, x, 4);
        x ^= __shfl_xor_sync(0xffffffffu, x, 8);
        x ^= __shfl_xor_sync(0xffffffffu, x, 16);
        const uint64_t n0 = __shfl_sync(0xffffffffu, x, 0);
        const uint64_t n1 = __shfl_sync(0xffffffffu, x, 1);
        const uint64_t n2 = __shfl_sync(0xffffffffu, x, 2);
        const uint64_t n3 = __shfl_sync(0xffffffffu, x, 3);
        const uint64_t next0 = mix64(n0 ^ n1 ^ n2 ^ n3 ^ s1);
        s1 = n1 + s2 + next0;
        s2 = n2 ^ s3 ^ next0;
        s3 = n3 + s0 + next0;
        s0 = next0;
    }
    if (lane == 0) out[walker] = s0 ^ s1 ^ s2 ^ s3;
}

__global__ void fill(uint64_t* buf, uint64_t words, uint64_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
         i += (uint64_t)gridDim.x * blockDim.x) {
        buf[i] = mix64(i ^ seed);
    }
}

struct Buffers {
    const uint64_t* local;
    uint64_t local_lines;
    const uint64_t* remote;
    uint64_t remote_lines;
    uint64_t* out;
};

// Best of three launches, in milliseconds.
static float time_walk(const Buffers& b, uint32_t walkers, uint32_t remote_per_1024, uint32_t steps,
                       bool bare) {
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int run = 0; run < 3; ++run) {
        CHECK(cudaEventRecord(start));
        walk<<<walkers, 32>>>(b.local, b.local_lines, b.remote, b.remote_lines, remote_per_1024, steps, bare, b.out);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return best;
}

static double report(const char* name, const Buffers& b, uint32_t walkers, uint32_t remote_per_1024,
                     uint32_t steps, bool bare = false) {
    const float ms = time_walk(b, walkers, remote_per_1024, steps, bare);
    const double ns = ms * 1e6 / steps;
    printf("%s walkers=%u remote_share=%.4f steps=%u ms=%.3f ns_per_step=%.1f\n", name, walkers,
           remote_per_1024 / 1024.0, steps, ms, ns);
    fflush(stdout);
    return ns;
}

int main(int argc, char** argv) {
    const double device_gib = argc > 1 ? atof(argv[1]) : 16.0;
    const double host_gib = argc > 2 ? atof(argv[2]) : 4.0;
    const uint32_t steps = argc > 3 ? (uint32_t)atoi(argv[3]) : 200000;
    if (device_gib <= 0 || host_gib <= 0 || steps == 0) {
        fprintf(stderr, "usage: locality-probe [DEVICE_GIB > 0] [HOST_GIB > 0] [STEPS > 0]\n");
        return 2;
    }

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MiB, sm_%d%d\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, prop.major, prop.minor);
    const uint32_t sms = (uint32_t)prop.multiProcessorCount;

    const uint64_t device_bytes = (uint64_t)(device_gib * (1ull << 30)) / 256 * 256;
    const uint64_t host_bytes = (uint64_t)(host_gib * (1ull << 30)) / 256 * 256;
    uint64_t* local = nullptr;
    uint64_t* host = nullptr;
    uint64_t* host_on_device = nullptr;
    uint64_t* out = nullptr;
    CHECK(cudaMalloc(&local, device_bytes));
    CHECK(cudaMalloc(&out, sizeof(uint64_t) * 4 * sms));
    CHECK(cudaHostAlloc(&host, host_bytes, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&host_on_device, host, 0));
    fill<<<4 * sms, 256>>>(local, device_bytes / 8, 1);
    CHECK(cudaGetLastError());
    for (uint64_t i = 0; i < host_bytes / 8; ++i) host[i] = i * 0x9E3779B97F4A7C15ull;
    CHECK(cudaDeviceSynchronize());

    Buffers b = {local, device_bytes / 256, host_on_device, host_bytes / 256, out};
    printf("device buffer %.1f GiB, host buffer %.1f GiB (mapped, pinned)\n", device_gib, host_gib);

    const double t1 = report("local", b, 1, 0, steps);
    const double tl = report("local", b, sms, 0, steps);
    const double t4 = report("local", b, 4 * sms, 0, steps);
    const double floor = report("local-bare", b, sms, 0, steps, true);
    // Host reads are slower: fewer steps keep the launch short.
    const uint32_t host_steps = steps / 4 > 0 ? steps / 4 : 1;
    const double th = report("host", b, sms, 1024, host_steps);
    const double m50 = report("mixed", b, sms, 512, host_steps);
    const double m25 = report("mixed", b, sms, 256, host_steps);
    const double m10 = report("mixed", b, sms, 102, host_steps);

    const double delta = th - tl;
    printf("t_l (one walker per SM) %.1f ns; alone %.1f ns; four per SM %.1f ns; the load alone %.1f ns\n",
           tl, t1, t4, floor);
    printf("Delta_host %.1f ns, Delta_host / t_l %.2f\n", delta, delta / tl);
    printf("linear model t_l + x Delta against measured: x=0.5 %.1f / %.1f, x=0.25 %.1f / %.1f, "
           "x=0.1 %.1f / %.1f ns\n",
           tl + 0.5 * delta, m50, tl + 0.25 * delta, m25, tl + 0.0996 * delta, m10);
    printf("caught at slack 1.25 when the remote share exceeds %.3f\n", 0.25 * tl / delta);

    CHECK(cudaFreeHost(host));
    CHECK(cudaFree(local));
    CHECK(cudaFree(out));
    return 0;
}
