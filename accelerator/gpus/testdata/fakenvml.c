/*
 * fakenvml: a stand-in for libnvidia-ml.so.1 on hosts without an NVIDIA
 * driver.
 *
 * go-nvml (accelerator/gpus) dlopens libnvidia-ml.so.1 and calls NVML's
 * functions by name, so a vgpu-node --backend cuda run with this library
 * on LD_LIBRARY_PATH discovers and reads GPUs through the real go-nvml
 * path: dlopen, the versioned-symbol lookups at Init, the structs passed
 * by pointer, the return codes and nvmlErrorString. It implements only the
 * calls vgpu makes (and the versioned names go-nvml prefers when they
 * exist):
 *
 *   - one GPU, the fake libcuda's (fakecuda.c): same name, same UUID,
 *     and the same memory, VGPU_FAKE_GPU_MEMORY bytes (read at nvmlInit,
 *     as fakecuda.c reads it at cuInit), else 64 MiB;
 *   - MIG disabled, PCI bus 00000000:19:00.0;
 *   - fixed readings a test can recognise: utilization 37%, memory used
 *     5 MiB, 41 degrees, 123456 mW, ECC errors 3 corrected and 0
 *     uncorrected;
 *   - every call but nvmlInit and nvmlErrorString fails with
 *     NVML_ERROR_UNINITIALIZED outside nvmlInit..nvmlShutdown, and with
 *     NVML_ERROR_INVALID_ARGUMENT for a handle that is not the GPU's or a
 *     NULL pointer, as NVML does.
 *
 * It is test code: no thread safety beyond what go-nvml needs (vgpu reads
 * NVML from one goroutine at a time per status request).
 */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_UNKNOWN = 999,
};

/* The layouts of nvml.h. */
typedef struct nvmlDevice_st {
	int index;
} *nvmlDevice_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;

#define NAME "vgpu fake GPU"
#define UUID "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf" /* fakecuda.c's cuDeviceGetUuid */
#define BUS_ID "00000000:19:00.0"
#define MEMORY_USED (5ull << 20)

static struct nvmlDevice_st gpu0 = {0};
static int inits; /* nvmlInit calls not yet shut down */
static unsigned long long memory = 64ull << 20;

nvmlReturn_t nvmlInit_v2(void) {
	const char *m = getenv("VGPU_FAKE_GPU_MEMORY");
	if (m && *m)
		memory = strtoull(m, NULL, 10);
	inits++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
	if (inits == 0)
		return NVML_ERROR_UNINITIALIZED;
	inits--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	}
	return "Unknown Error";
}

#define NEED_INIT()                                                                                \
	do {                                                                                       \
		if (inits == 0)                                                                    \
			return NVML_ERROR_UNINITIALIZED;                                           \
	} while (0)

/* NEED_GPU checks the library is initialised, d is the GPU's handle and
 * out is a pointer. */
#define NEED_GPU(d, out)                                                                           \
	do {                                                                                       \
		NEED_INIT();                                                                       \
		if ((d) != &gpu0 || !(out))                                                        \
			return NVML_ERROR_INVALID_ARGUMENT;                                        \
	} while (0)

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	NEED_INIT();
	if (!n)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = 1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	NEED_INIT();
	if (i != 0 || !d)
		return NVML_ERROR_INVALID_ARGUMENT;
	*d = &gpu0;
	return NVML_SUCCESS;
}

/* copy writes s into buf of n bytes, as NVML's string getters. */
static nvmlReturn_t copy(char *buf, unsigned int n, const char *s) {
	if (strlen(s) + 1 > n)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, s);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int n) {
	NEED_GPU(d, uuid);
	return copy(uuid, n, UUID);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
	NEED_GPU(d, name);
	return copy(name, n, NAME);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	NEED_GPU(d, m);
	m->total = memory;
	m->used = MEMORY_USED;
	m->free = memory - MEMORY_USED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	NEED_GPU(d, p);
	memset(p, 0, sizeof *p);
	strcpy(p->busIdLegacy, "0000:19:00.0");
	p->bus = 0x19;
	p->pciDeviceId = 0x233510de; /* NVIDIA's vendor id, an H200's device id */
	strcpy(p->busId, BUS_ID);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
	NEED_GPU(d, current);
	if (!pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	*current = *pending = 0; /* NVML_DEVICE_MIG_DISABLE */
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	NEED_GPU(d, u);
	u->gpu = 37;
	u->memory = 12;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
	NEED_GPU(d, t);
	if (sensor != 0) /* NVML_TEMPERATURE_GPU, the only sensor */
		return NVML_ERROR_INVALID_ARGUMENT;
	*t = 41;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
	NEED_GPU(d, mw);
	*mw = 123456;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
	NEED_GPU(d, n);
	/* NVML_MEMORY_ERROR_TYPE_CORRECTED 0, _UNCORRECTED 1; NVML_VOLATILE_ECC 0,
	 * NVML_AGGREGATE_ECC 1. */
	if ((type != 0 && type != 1) || (counter != 0 && counter != 1))
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = type == 0 ? 3 : 0;
	return NVML_SUCCESS;
}
