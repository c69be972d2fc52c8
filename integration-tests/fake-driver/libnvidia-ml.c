/* A stand-in for NVML (libnvidia-ml.so.1), for tests on machines without a GPU: NVML that
 * starts and counts FAKE_NVML_DEVICES GPUs (default 1), as on a host whose driver is installed
 * but whose CUDA library cannot be loaded (a container without the NVIDIA runtime's compute
 * capability, a broken install). Every other query is unsupported. */
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

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2() { return NVML_ERROR_NOT_SUPPORTED; }
