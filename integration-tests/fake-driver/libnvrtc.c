/* A stand-in for NVRTC, for tests on machines without the CUDA toolkit: it reports a version
 * (FAKE_NVRTC_VERSION, "major.minor", default "13.0") and the architectures of that release,
 * and compiles nothing. The miner asks for the version before it compiles anything. */
#include <stdio.h>
#include <stdlib.h>

typedef int nvrtcResult;
enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_INVALID_INPUT = 3, NVRTC_ERROR_COMPILATION = 6 };

static const int archs[] = {75, 80, 86, 87, 89, 90, 100, 120};

nvrtcResult nvrtcVersion(int *major, int *minor) {
    const char *v = getenv("FAKE_NVRTC_VERSION");
    *major = 13;
    *minor = 0;
    if (v && sscanf(v, "%d.%d", major, minor) != 2) return NVRTC_ERROR_INVALID_INPUT;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int *count) {
    *count = (int)(sizeof archs / sizeof archs[0]);
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetSupportedArchs(int *out) {
    for (unsigned i = 0; i < sizeof archs / sizeof archs[0]; i++) out[i] = archs[i];
    return NVRTC_SUCCESS;
}

const char *nvrtcGetErrorString(nvrtcResult result) {
    (void)result;
    return "fake NVRTC compiles nothing";
}

nvrtcResult nvrtcCreateProgram() { return NVRTC_ERROR_COMPILATION; }
nvrtcResult nvrtcCompileProgram() { return NVRTC_ERROR_COMPILATION; }
nvrtcResult nvrtcDestroyProgram() { return NVRTC_SUCCESS; }
