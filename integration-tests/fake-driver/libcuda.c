/* A stand-in for the NVIDIA driver's libcuda, for tests on machines without a GPU.
 *
 * The tests build it into a directory of their own and put that directory first on
 * LD_LIBRARY_PATH, so the miner loads it in place of the real library. It answers the queries
 * the miner makes before it uses a device (version, count, names, attributes) as the
 * environment tells it, and refuses everything that would touch a device:
 *
 *   FAKE_CUDA_VERSION   what cuDriverGetVersion reports (default 13000, CUDA 13.0)
 *   FAKE_CUDA_DEVICES   how many devices there are (default 1; 0: cuInit says no device)
 *
 * Built with -DFAKE_CUDA_OMIT_LAUNCH it lacks cuLaunchKernel, as a damaged or foreign libcuda
 * would. It is a test fixture, not a driver: nothing here runs a kernel. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static int devices(void) { return env_int("FAKE_CUDA_DEVICES", 1); }
static int initialised = 0;

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = env_int("FAKE_CUDA_VERSION", 13000);
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    if (devices() <= 0) return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    *text = error == CUDA_ERROR_NOT_SUPPORTED ? "operation not supported (fake driver)" : "fake driver error";
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = devices();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    (void)device;
    strncpy(name, "NVIDIA H100 80GB HBM3 (fake driver)", (size_t)len);
    if (len > 0) name[len - 1] = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    for (int i = 0; i < 16; i++) uuid->bytes[i] = (char)(0xf0 + device + i);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    (void)device;
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    switch (attribute) {
    case 16: *value = 132; break;        /* multiprocessors */
    case 33: *value = 0x19 + device; break; /* PCI bus */
    case 34: *value = 0; break;          /* PCI device */
    case 50: *value = 0; break;          /* PCI domain */
    case 75: *value = 9; break;          /* compute capability major */
    case 76: *value = 0; break;          /* compute capability minor */
    default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

/* Everything that would touch a device: the miner must never get here with a fake driver
 * unless the test means it to, and then it gets an error, not a crash. */
#define REFUSE(name) CUresult name() { return CUDA_ERROR_NOT_SUPPORTED; }
REFUSE(cuDevicePrimaryCtxRetain)
REFUSE(cuDevicePrimaryCtxRelease_v2)
REFUSE(cuDevicePrimaryCtxGetState)
REFUSE(cuDevicePrimaryCtxReset_v2)
REFUSE(cuCtxSetCurrent)
REFUSE(cuCtxGetCurrent)
REFUSE(cuCtxSynchronize)
REFUSE(cuStreamCreate)
REFUSE(cuStreamDestroy_v2)
REFUSE(cuStreamSynchronize)
REFUSE(cuStreamWaitEvent)
REFUSE(cuEventCreate)
REFUSE(cuEventDestroy_v2)
REFUSE(cuEventRecord)
REFUSE(cuEventSynchronize)
REFUSE(cuEventQuery)
REFUSE(cuMemGetInfo_v2)
REFUSE(cuMemAlloc_v2)
REFUSE(cuMemFree_v2)
REFUSE(cuMemAllocAsync)
REFUSE(cuMemFreeAsync)
REFUSE(cuMemcpyHtoDAsync_v2)
REFUSE(cuMemcpyDtoHAsync_v2)
REFUSE(cuModuleLoadData)
REFUSE(cuModuleUnload)
REFUSE(cuModuleGetFunction)
REFUSE(cuFuncSetAttribute)
REFUSE(cuTensorMapEncodeTiled)
#ifndef FAKE_CUDA_OMIT_LAUNCH
REFUSE(cuLaunchKernel)
#endif
