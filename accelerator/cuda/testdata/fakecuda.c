/*
 * fakecuda: a stand-in for libcuda.so.1 on hosts without an NVIDIA GPU.
 *
 * The cuda package's tests build this with gcc into a shared library and
 * load it through the same dlopen path as the real driver, so that argument
 * passing (pointers, 64-bit device addresses, structs by pointer), error
 * codes and the error paths of the binding and of the cuda backend run for
 * real. It implements the driver calls the backend uses over host memory:
 *
 *   - one device ("vgpu fake GPU") whose memory size fake_set_memory sets;
 *   - a primary context that must be current on the calling thread
 *     (thread-local, as in the real driver) for every memory call;
 *   - virtual memory management: address reservations, physical
 *     allocations (filled with 0xCD, since cuMemCreate does not zero), maps
 *     of whole allocations at granularity-aligned addresses, access that
 *     must be set before a mapped range is touched;
 *   - copies and memsets that resolve every device byte through the maps
 *     and fail with CUDA_ERROR_INVALID_VALUE on an unmapped or inaccessible
 *     byte; asynchronous calls run synchronously, streams are counters;
 *   - pinned host memory from malloc.
 *
 * Error injection: fake_inject(name, code, skip) makes the call called name
 * return code after skip more successful calls of it (once). Leak checks:
 * fake_live() counts physical allocations, reservations, maps, streams and
 * pinned buffers not yet freed.
 *
 * It is test code: single device, linear lookups, no thread safety beyond
 * what the tests need (the backend serialises its calls per device).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_UNKNOWN = 999,
};

#define GRANULARITY (2u << 20)

typedef struct {
	int type;
	int requestedHandleTypes;
	int locType;
	int locId;
	void *win32HandleMetaData;
	unsigned char compressionType, gpuDirectRDMACapable;
	unsigned short usage;
	unsigned char reserved[4];
} CUmemAllocationProp;

typedef struct {
	int locType;
	int locId;
	int flags;
} CUmemAccessDesc;

/* Injected failure: name, code, calls to let through first. */
static char inject_name[64];
static int inject_code, inject_skip;

void fake_inject(const char *name, int code, int skip) {
	strncpy(inject_name, name, sizeof inject_name - 1);
	inject_code = code;
	inject_skip = skip;
}

static int injected(const char *name) {
	if (inject_name[0] == 0 || strcmp(name, inject_name) != 0)
		return 0;
	if (inject_skip-- > 0)
		return 0;
	inject_name[0] = 0;
	return inject_code;
}

#define INJECT(name)                                                                               \
	do {                                                                                       \
		int c_ = injected(name);                                                           \
		if (c_)                                                                            \
			return c_;                                                                 \
	} while (0)

static int initialised;
static size_t memory = 64u << 20; /* the device's memory; physical allocations count against it */
static size_t committed;
static int primary_refs;
static char primary; /* the primary context's identity */
static __thread void *current;
static long calls_htod, calls_dtoh, calls_memset, calls_dtod; /* what the tests may check was used */

void fake_set_memory(size_t n) { memory = n; }
long fake_calls(int which) {
	switch (which) {
	case 0:
		return calls_htod;
	case 1:
		return calls_dtoh;
	case 2:
		return calls_memset;
	}
	return calls_dtod;
}

#define MAXN 4096
static struct alloc {
	int live;
	size_t size;
	unsigned char *mem;
} allocs[MAXN];
static struct reservation {
	int live;
	CUdeviceptr addr;
	size_t size;
} reservations[MAXN];
static struct map {
	int live, access;
	CUdeviceptr addr;
	size_t size;
	int alloc;
} maps[MAXN];
static CUdeviceptr next_va = 0x7f0000000000ull;
static int streams, pinned;

int fake_live(void) {
	int n = streams + pinned;
	for (int i = 0; i < MAXN; i++)
		n += allocs[i].live + reservations[i].live + maps[i].live;
	return n;
}

#define NEED_INIT()                                                                                \
	do {                                                                                       \
		if (!initialised)                                                                  \
			return CUDA_ERROR_NOT_INITIALIZED;                                         \
	} while (0)
#define NEED_CTX()                                                                                 \
	do {                                                                                       \
		NEED_INIT();                                                                       \
		if (current != &primary || primary_refs == 0)                                      \
			return CUDA_ERROR_INVALID_CONTEXT;                                         \
	} while (0)

CUresult cuInit(unsigned int flags) {
	INJECT("cuInit");
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	initialised = 1;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	NEED_INIT();
	INJECT("cuDeviceGetCount");
	*n = 1;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = 0;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT();
	if (d != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len < 1)
		return CUDA_ERROR_INVALID_VALUE;
	strncpy(name, "vgpu fake GPU", len - 1);
	name[len - 1] = 0;
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	NEED_INIT();
	if (d != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = memory;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char uuid[16], CUdevice d) {
	NEED_INIT();
	if (d != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	for (int i = 0; i < 16; i++)
		uuid[i] = (unsigned char)(0xa0 + i);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
	NEED_INIT();
	INJECT("cuDevicePrimaryCtxRetain");
	if (d != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	primary_refs++;
	*ctx = &primary;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	if (d != 0 || primary_refs == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	primary_refs--;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	NEED_INIT();
	if (ctx != NULL && ctx != &primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	current = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	INJECT("cuCtxSynchronize");
	return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
	NEED_CTX();
	if (!g || !prop || prop->type != 1 || prop->locType != 1 || prop->locId != 0 || option < 0 || option > 1)
		return CUDA_ERROR_INVALID_VALUE;
	*g = GRANULARITY;
	return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
	NEED_CTX();
	INJECT("cuMemAddressReserve");
	if (!ptr || size == 0 || size % GRANULARITY || flags != 0 || (align && align % GRANULARITY))
		return CUDA_ERROR_INVALID_VALUE;
	(void)addr; /* a hint */
	for (int i = 0; i < MAXN; i++)
		if (!reservations[i].live) {
			reservations[i] = (struct reservation){1, next_va, size};
			*ptr = next_va;
			next_va += size + GRANULARITY; /* a gap: running off a reservation faults */
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	NEED_CTX();
	for (int i = 0; i < MAXN; i++)
		if (reservations[i].live && reservations[i].addr == ptr && reservations[i].size == size) {
			for (int j = 0; j < MAXN; j++)
				if (maps[j].live && maps[j].addr >= ptr && maps[j].addr < ptr + size)
					return CUDA_ERROR_INVALID_VALUE; /* still mapped */
			reservations[i].live = 0;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
	NEED_CTX();
	INJECT("cuMemCreate");
	if (!h || !prop || prop->type != 1 || prop->locType != 1 || prop->locId != 0 || flags != 0 || size == 0 ||
	    size % GRANULARITY)
		return CUDA_ERROR_INVALID_VALUE;
	if (committed + size > memory)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; i < MAXN; i++)
		if (!allocs[i].live) {
			unsigned char *m = malloc(size);
			if (!m)
				return CUDA_ERROR_OUT_OF_MEMORY;
			memset(m, 0xCD, size); /* physical memory comes with someone's old bytes */
			allocs[i] = (struct alloc){1, size, m};
			committed += size;
			*h = (CUmemGenericAllocationHandle)i + 1;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	NEED_CTX();
	if (h < 1 || h > MAXN || !allocs[h - 1].live)
		return CUDA_ERROR_INVALID_VALUE;
	/* As in the driver, memory still mapped is freed when unmapped. */
	allocs[h - 1].live = 0;
	committed -= allocs[h - 1].size;
	int mapped = 0;
	for (int j = 0; j < MAXN; j++)
		mapped |= maps[j].live && maps[j].alloc == (int)h - 1;
	if (!mapped) {
		free(allocs[h - 1].mem);
		allocs[h - 1].mem = NULL;
	}
	return CUDA_SUCCESS;
}

static int reserved(CUdeviceptr addr, size_t size) {
	for (int i = 0; i < MAXN; i++)
		if (reservations[i].live && addr >= reservations[i].addr &&
		    addr + size <= reservations[i].addr + reservations[i].size)
			return 1;
	return 0;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
	NEED_CTX();
	INJECT("cuMemMap");
	if (h < 1 || h > MAXN || !allocs[h - 1].live || offset != 0 || flags != 0 || size != allocs[h - 1].size ||
	    ptr % GRANULARITY || !reserved(ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	for (int j = 0; j < MAXN; j++)
		if (maps[j].live && ptr < maps[j].addr + maps[j].size && maps[j].addr < ptr + size)
			return CUDA_ERROR_INVALID_VALUE; /* already mapped */
	for (int j = 0; j < MAXN; j++)
		if (!maps[j].live) {
			maps[j] = (struct map){1, 0, ptr, size, (int)h - 1};
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
	NEED_CTX();
	INJECT("cuMemUnmap");
	for (int j = 0; j < MAXN; j++)
		if (maps[j].live && maps[j].addr == ptr && maps[j].size == size) {
			int a = maps[j].alloc;
			maps[j].live = 0;
			if (!allocs[a].live && allocs[a].mem) {
				free(allocs[a].mem);
				allocs[a].mem = NULL;
			}
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	NEED_CTX();
	INJECT("cuMemSetAccess");
	if (!desc || count != 1 || desc->locType != 1 || desc->locId != 0 || desc->flags != 3)
		return CUDA_ERROR_INVALID_VALUE;
	int found = 0;
	for (int j = 0; j < MAXN; j++)
		if (maps[j].live && maps[j].addr >= ptr && maps[j].addr + maps[j].size <= ptr + size) {
			maps[j].access = 1;
			found += maps[j].size;
		}
	return found == (int)size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* resolve returns the host bytes behind device address a, and in *n how
 * many follow in the same map, or NULL if a is not accessible. */
static unsigned char *resolve(CUdeviceptr a, size_t *n) {
	for (int j = 0; j < MAXN; j++)
		if (maps[j].live && a >= maps[j].addr && a < maps[j].addr + maps[j].size) {
			if (!maps[j].access || !allocs[maps[j].alloc].mem)
				return NULL;
			*n = maps[j].addr + maps[j].size - a;
			return allocs[maps[j].alloc].mem + (a - maps[j].addr);
		}
	return NULL;
}

/* each calls fn on the host runs behind [a, a+size); checks them all first. */
static CUresult each(CUdeviceptr a, size_t size, void (*fn)(unsigned char *, size_t, size_t, void *), void *arg) {
	for (size_t done = 0; done < size;) {
		size_t n;
		if (!resolve(a + done, &n))
			return CUDA_ERROR_INVALID_VALUE;
		done += n < size - done ? n : size - done;
	}
	for (size_t done = 0; done < size;) {
		size_t n;
		unsigned char *p = resolve(a + done, &n);
		if (n > size - done)
			n = size - done;
		fn(p, n, done, arg);
		done += n;
	}
	return CUDA_SUCCESS;
}

static void to_dev(unsigned char *p, size_t n, size_t off, void *src) { memcpy(p, (unsigned char *)src + off, n); }
static void from_dev(unsigned char *p, size_t n, size_t off, void *dst) { memcpy((unsigned char *)dst + off, p, n); }
static void set(unsigned char *p, size_t n, size_t off, void *v) {
	(void)off;
	memset(p, *(unsigned char *)v, n);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	NEED_CTX();
	INJECT("cuMemcpyHtoD");
	if (!src && n)
		return CUDA_ERROR_INVALID_VALUE;
	calls_htod++;
	return each(dst, n, to_dev, (void *)src);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	INJECT("cuMemcpyDtoH");
	if (!dst && n)
		return CUDA_ERROR_INVALID_VALUE;
	calls_dtoh++;
	return each(src, n, from_dev, dst);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	if (!s)
		return CUDA_ERROR_INVALID_VALUE; /* the backend always names its stream */
	return cuMemcpyHtoD_v2(dst, src, n);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	return cuMemcpyDtoH_v2(dst, src, n);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	INJECT("cuMemcpyDtoD");
	if ((dst < src + n && src < dst + n) && n)
		return CUDA_ERROR_INVALID_VALUE; /* the driver leaves overlap undefined: refuse it */
	unsigned char *tmp = malloc(n ? n : 1);
	if (!tmp)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = each(src, n, from_dev, tmp);
	if (r == CUDA_SUCCESS)
		r = each(dst, n, to_dev, tmp);
	free(tmp);
	calls_dtod++;
	return r;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	NEED_CTX();
	INJECT("cuMemsetD8");
	calls_memset++;
	return each(dst, n, set, &v);
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	NEED_CTX();
	INJECT("cuStreamCreate");
	if (!s || flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	streams++;
	*s = malloc(1);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	NEED_CTX();
	INJECT("cuStreamSynchronize");
	return s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	free(s);
	streams--;
	return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	NEED_CTX();
	INJECT("cuMemHostAlloc");
	if (!p || n == 0 || flags > 0xf)
		return CUDA_ERROR_INVALID_VALUE;
	*p = malloc(n);
	if (!*p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pinned++;
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	free(p);
	pinned--;
	return CUDA_SUCCESS;
}

static const char *names[][2] = {
    {"CUDA_SUCCESS", "no error"},
    {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
};

static int lookup(CUresult r) {
	switch (r) {
	case 0:
	case 1:
	case 2:
	case 3:
		return r;
	}
	return -1;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	int i = lookup(r);
	if (!s || i < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*s = names[i][1];
	return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
	int i = lookup(r);
	if (!s || i < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*s = names[i][0];
	return CUDA_SUCCESS;
}
