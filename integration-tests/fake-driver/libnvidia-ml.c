/* A stand-in for NVML (libnvidia-ml.so.1), for tests on machines without a GPU: NVML that
 * starts and counts FAKE_NVML_DEVICES GPUs (default 1), as on a host whose driver is installed
 * but whose CUDA library cannot be loaded (a container without the NVIDIA runtime's compute
 * capability, a broken install). Every other query is unsupported, unless FAKE_NVML_TELEMETRY
 * or FAKE_NVML_CC is set (below). */
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

static const char *cc_mode(void) {
    const char *v = getenv("FAKE_NVML_CC");
    return v && *v ? v : NULL;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, fake_device **device) {
    if ((!telemetry() && !cc_mode()) || index >= 16) return NVML_ERROR_NOT_SUPPORTED;
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

/* Confidential computing. FAKE_NVML_CC is the system's CC mode: "off", "on", "devtools" or
 * "ppcie"; unset, CC is not supported. Where it is on, each GPU's attestation report and
 * certificate chain come from the program FAKE_NVML_EVIDENCE, run as `report <index> <nonce hex>`
 * (it prints the report as hex) and `chain <index>` (it prints the PEM chain): the test's own
 * PKI signs over the nonce the caller gave, as a GPU would. */
nvmlReturn_t nvmlDeviceGetName(fake_device *device, char *name, unsigned len) {
    (void)device;
    strncpy(name, "NVIDIA H100 80GB HBM3", len);
    if (len > 0) name[len - 1] = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, fake_device **device) {
    unsigned index;
    if (sscanf(uuid, "GPU-fake-%u", &index) != 1) return NVML_ERROR_NOT_SUPPORTED;
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

typedef struct { unsigned version, environment, ccFeature, devToolsMode, multiGpuMode; } fake_cc_settings;
nvmlReturn_t nvmlSystemGetConfComputeSettings(fake_cc_settings *settings) {
    const char *mode = cc_mode();
    if (!mode) return NVML_ERROR_NOT_SUPPORTED;
    settings->environment = 0;
    settings->ccFeature = strcmp(mode, "off") != 0;
    settings->devToolsMode = strcmp(mode, "devtools") == 0;
    settings->multiGpuMode = strcmp(mode, "ppcie") == 0;
    return NVML_SUCCESS;
}

/* Runs FAKE_NVML_EVIDENCE with `args` and reads what it prints, at most `cap` bytes. */
static long run_evidence(const char *args, char *out, size_t cap) {
    const char *program = getenv("FAKE_NVML_EVIDENCE");
    char command[512];
    if (!program || !*program) return -1;
    snprintf(command, sizeof command, "'%s' %s", program, args);
    FILE *pipe = popen(command, "r");
    if (!pipe) return -1;
    size_t got = fread(out, 1, cap, pipe);
    int status = pclose(pipe);
    return status == 0 ? (long)got : -1;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

typedef struct {
    unsigned isCecAttestationReportPresent, attestationReportSize, cecAttestationReportSize;
    unsigned char nonce[32], attestationReport[8192], cecAttestationReport[4096];
} fake_report;
nvmlReturn_t nvmlDeviceGetConfComputeGpuAttestationReport(fake_device *device, fake_report *report) {
    static char text[2 * 8192 + 2];
    char args[96];
    int at = snprintf(args, sizeof args, "report %u ", device->index);
    for (int i = 0; i < 32; i++) at += snprintf(args + at, sizeof args - at, "%02x", report->nonce[i]);
    long got = run_evidence(args, text, sizeof text - 1);
    if (got < 0) return NVML_ERROR_NOT_SUPPORTED;
    unsigned size = 0;
    for (long i = 0; i + 1 < got && size < sizeof report->attestationReport; i += 2) {
        int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
        if (hi < 0 || lo < 0) break;
        report->attestationReport[size++] = (unsigned char)(hi << 4 | lo);
    }
    report->attestationReportSize = size;
    report->isCecAttestationReportPresent = 0;
    report->cecAttestationReportSize = 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned certChainSize, attestationCertChainSize;
    unsigned char certChain[4096], attestationCertChain[5120];
} fake_certificate;
nvmlReturn_t nvmlDeviceGetConfComputeGpuCertificate(fake_device *device, fake_certificate *certificate) {
    char args[32];
    snprintf(args, sizeof args, "chain %u", device->index);
    long got = run_evidence(args, (char *)certificate->attestationCertChain, sizeof certificate->attestationCertChain);
    if (got < 0) return NVML_ERROR_NOT_SUPPORTED;
    certificate->attestationCertChainSize = (unsigned)got;
    certificate->certChainSize = 0;
    return NVML_SUCCESS;
}
