/* A stand-in for NVML (libnvidia-ml.so.1), for tests on machines without a GPU: NVML that
 * starts and counts FAKE_NVML_DEVICES GPUs (default 1), as on a host whose driver is installed
 * but whose CUDA library cannot be loaded (a container without the NVIDIA runtime's compute
 * capability, a broken install). Every other query is unsupported, unless FAKE_NVML_TELEMETRY
 * is set (below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3 };

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "not supported by the fake NVML"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    strncpy(version, "550.54.15", len);
    if (len > 0) version[len - 1] = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    const char *v = getenv("FAKE_NVML_DEVICES");
    *count = v && *v ? (unsigned)atoi(v) : 1;
    return NVML_SUCCESS;
}

/* With FAKE_NVML_TELEMETRY set, each GPU also answers the live readings the miner's metrics
 * take at each scrape (fixed values a test can look for); without it, handles are refused as
 * before, so detection sees "NVML, but no device it can query". */
typedef struct { unsigned index; } fake_device;
static fake_device fake_devices[16];

static int telemetry(void) {
    const char *v = getenv("FAKE_NVML_TELEMETRY");
    return v && *v;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, fake_device **device) {
    if (!telemetry() || index >= 16) return NVML_ERROR_NOT_SUPPORTED;
    fake_devices[index].index = index;
    *device = &fake_devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(fake_device *device, char *uuid, unsigned len) {
    char text[32];
    snprintf(text, sizeof text, "GPU-fake-%u", device->index);
    strncpy(uuid, text, len);
    if (len > 0) uuid[len - 1] = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(fake_device *device, int sensor, unsigned *celsius) {
    (void)sensor;
    *celsius = 61 + device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(fake_device *device, unsigned *milliwatts) {
    (void)device;
    *milliwatts = 312500;
    return NVML_SUCCESS;
}

typedef struct { unsigned gpu, memory; } fake_utilization;
nvmlReturn_t nvmlDeviceGetUtilizationRates(fake_device *device, fake_utilization *u) {
    (void)device;
    u->gpu = 87;
    u->memory = 40;
    return NVML_SUCCESS;
}

typedef struct { unsigned version; unsigned long long total, reserved, free, used; } fake_memory_v2;
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(fake_device *device, fake_memory_v2 *m) {
    (void)device;
    m->total = 80ULL << 30;
    m->reserved = 0;
    m->used = 3ULL << 30;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

enum { FAKE_CLOCK_GRAPHICS = 0, FAKE_CLOCK_SM = 1, FAKE_CLOCK_MEM = 2 };
nvmlReturn_t nvmlDeviceGetClockInfo(fake_device *device, int clock, unsigned *mhz) {
    (void)device;
    *mhz = clock == FAKE_CLOCK_MEM ? 2619 : 1980;
    return NVML_SUCCESS;
}
