/*
 * fakecuda: a stand-in for libcuda.so.1 on hosts without an NVIDIA GPU.
 *
 * The tests build this with gcc into a shared library (internal/fakegpu) and
 * load it through the same dlopen path as the real driver, so that argument
 * passing (pointers, 64-bit device addresses, structs by pointer), error
 * codes and the error paths of the binding and of the cuda backend run for
 * real. It implements the driver calls the backend uses over host memory:
 *
 *   - one device ("vgpu fake GPU") whose memory size fake_set_memory sets
 *     (or VGPU_FAKE_GPU_MEMORY, in bytes, at cuInit);
 *   - a primary context that must be current on the calling thread
 *     (thread-local, as in the real driver) for every memory call;
 *   - virtual memory management, with the host's own: an address
 *     reservation is a PROT_NONE mmap of host addresses, a physical
 *     allocation a memfd (filled with 0xCD, since cuMemCreate does not
 *     zero), a map an mmap of it at a granularity-aligned address of the
 *     reservation, readable and writable only once access is set. A device
 *     address is therefore a host address, so that kernels (fakekernels.cc)
 *     dereference device pointers as on a GPU, and a buffer spanning frames
 *     is contiguous as there;
 *   - cuMemAlloc: plain aligned host memory, device addressable too;
 *   - modules and launches: cuModuleLoadData accepts the text the fake
 *     NVRTC (fakenvrtc.c) emits, one ".entry NAME" line per kernel;
 *     cuModuleGetFunction finds NAME there and in fakekernels.cc, the
 *     catalog's CUDA C compiled for the host; cuLaunchKernel runs it over
 *     every block and thread of the grid in turn, passing kernelParams (an
 *     array of pointers to the arguments) as the driver does. Kernels must
 *     therefore not use shared memory or barriers (the catalog's do not);
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
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef struct module *CUmodule;
typedef struct function *CUfunction;

/* fakekernels.cc: the catalog's kernels compiled for the host. Weak, so
 * that this file alone still builds a driver (without kernels). */
__attribute__((weak)) void *fake_kernel(const char *name);
__attribute__((weak)) int fake_run(void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				   unsigned bz, void **params);

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
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
static long calls_htod, calls_dtoh, calls_memset, calls_dtod, calls_launch; /* what the tests may check was used */

void fake_set_memory(size_t n) { memory = n; }
long fake_calls(int which) {
	switch (which) {
	case 0:
		return calls_htod;
	case 1:
		return calls_dtoh;
	case 2:
		return calls_memset;
	case 3:
		return calls_dtod;
	}
	return calls_launch;
}

#define MAXN 4096
static struct alloc {
	int live;
	size_t size;
	int fd; /* the memory, until released and unmapped everywhere; -1 after */
} allocs[MAXN];
static struct reservation {
	int live;
	CUdeviceptr addr;
	size_t size;
	void *mapping; /* the host mmap holding it, rounded out to alignment */
	size_t mapped;
} reservations[MAXN];
static struct map {
	int live, access;
	CUdeviceptr addr;
	size_t size;
	int alloc;
} maps[MAXN];
static struct plain {
	int live;
	CUdeviceptr addr;
	size_t size;
} plains[MAXN]; /* cuMemAlloc */
static int streams, pinned, modules;

int fake_live(void) {
	int n = streams + pinned + modules;
	for (int i = 0; i < MAXN; i++)
		n += allocs[i].live + reservations[i].live + maps[i].live + plains[i].live;
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
	/* A process that loads this library in place of the driver (a
	 * vgpu-node run by a test) sizes the device with the environment,
	 * as the fake NVML (accelerator/gpus/testdata/fakenvml.c) does. */
	const char *m = getenv("VGPU_FAKE_GPU_MEMORY");
	if (m && *m)
		memory = strtoull(m, NULL, 10);
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
			/* Room to align, and a gap after: running off a reservation faults. */
			size_t n = size + 2 * GRANULARITY;
			void *m = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (m == MAP_FAILED)
				return CUDA_ERROR_OUT_OF_MEMORY;
			CUdeviceptr a = ((CUdeviceptr)m + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
			reservations[i] = (struct reservation){1, a, size, m, n};
			*ptr = a;
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
			munmap(reservations[i].mapping, reservations[i].mapped);
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
		if (!allocs[i].live && allocs[i].fd <= 0) {
			int fd = memfd_create("fakecuda", MFD_CLOEXEC);
			if (fd < 0 || ftruncate(fd, size) != 0) {
				if (fd >= 0)
					close(fd);
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
			unsigned char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (m == MAP_FAILED) {
				close(fd);
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
			memset(m, 0xCD, size); /* physical memory comes with someone's old bytes */
			munmap(m, size);
			allocs[i] = (struct alloc){1, size, fd};
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
		close(allocs[h - 1].fd);
		allocs[h - 1].fd = -1;
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
			/* Inaccessible until cuMemSetAccess. */
			if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, allocs[h - 1].fd, 0) == MAP_FAILED)
				return CUDA_ERROR_OUT_OF_MEMORY;
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
			/* Back to a hole of the reservation. */
			mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
			int mapped = 0;
			for (int k = 0; k < MAXN; k++)
				mapped |= maps[k].live && maps[k].alloc == a;
			if (!allocs[a].live && allocs[a].fd > 0 && !mapped) {
				close(allocs[a].fd);
				allocs[a].fd = -1;
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
			if (mprotect((void *)maps[j].addr, maps[j].size, PROT_READ | PROT_WRITE) != 0)
				return CUDA_ERROR_UNKNOWN;
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
			if (!maps[j].access)
				return NULL;
			*n = maps[j].addr + maps[j].size - a;
			return (unsigned char *)a;
		}
	for (int j = 0; j < MAXN; j++)
		if (plains[j].live && a >= plains[j].addr && a < plains[j].addr + plains[j].size) {
			*n = plains[j].addr + plains[j].size - a;
			return (unsigned char *)a;
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

/* The compute capability the fake reports: an H100/H200's. */
enum { CC_MAJOR = 75, CC_MINOR = 76 };

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	NEED_INIT();
	INJECT("cuDeviceGetAttribute");
	if (d != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CC_MAJOR:
		*v = 9;
		return CUDA_SUCCESS;
	case CC_MINOR:
		*v = 0;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	INJECT("cuMemAlloc");
	if (!p || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (committed + n > memory)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; i < MAXN; i++)
		if (!plains[i].live) {
			void *m;
			if (posix_memalign(&m, 256, n) != 0)
				return CUDA_ERROR_OUT_OF_MEMORY;
			memset(m, 0xCD, n);
			plains[i] = (struct plain){1, (CUdeviceptr)m, n};
			committed += n;
			*p = (CUdeviceptr)m;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	for (int i = 0; i < MAXN; i++)
		if (plains[i].live && plains[i].addr == p) {
			plains[i].live = 0;
			committed -= plains[i].size;
			free((void *)p);
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

/* A module: the kernel names of the image it was loaded from. */
#define MAXK 64
struct function {
	char name[64];
	void *kernel; /* fakekernels.cc's */
	CUmodule module;
};
struct module {
	int n;
	struct function fns[MAXK];
};

/* The image the fake NVRTC writes: a header line, then ".entry NAME" lines. */
static const char image_header[] = "// vgpu fake cubin\n";

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
	NEED_CTX();
	INJECT("cuModuleLoadData");
	if (!m || !image)
		return CUDA_ERROR_INVALID_VALUE;
	const char *s = image;
	if (strncmp(s, image_header, sizeof image_header - 1) != 0)
		return CUDA_ERROR_INVALID_IMAGE;
	struct module *mod = calloc(1, sizeof *mod);
	if (!mod)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (s += sizeof image_header - 1; *s;) {
		const char *nl = strchr(s, '\n');
		size_t len = nl ? (size_t)(nl - s) : strlen(s);
		if (len < 8 || strncmp(s, ".entry ", 7) != 0 || len - 7 >= sizeof mod->fns[0].name || mod->n == MAXK) {
			free(mod); /* not a line the fake NVRTC writes: a corrupt image */
			return CUDA_ERROR_INVALID_IMAGE;
		}
		memcpy(mod->fns[mod->n].name, s + 7, len - 7);
		mod->fns[mod->n].module = mod;
		mod->n++;
		s += len + (nl != NULL);
	}
	modules++;
	*m = mod;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
	NEED_CTX();
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	free(m);
	modules--;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
	NEED_CTX();
	if (!f || !m || !name)
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < m->n; i++)
		if (strcmp(m->fns[i].name, name) == 0) {
			/* A kernel the image lists but the host build lacks: the
			 * catalog and fakekernels.cc disagree. */
			if (!fake_kernel || !(m->fns[i].kernel = fake_kernel(name)))
				return CUDA_ERROR_NOT_FOUND;
			*f = &m->fns[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			unsigned shared, CUstream s, void **params, void **extra) {
	NEED_CTX();
	INJECT("cuLaunchKernel");
	if (!f || !f->kernel)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!s || extra || !params || !gx || !gy || !gz || !bx || !by || !bz)
		return CUDA_ERROR_INVALID_VALUE; /* the backend names its stream and passes kernelParams */
	if ((unsigned long long)bx * by * bz > 1024 || shared > 48 * 1024)
		return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
	calls_launch++;
	return fake_run(f->kernel, gx, gy, gz, bx, by, bz, params) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

static const char *names[][2] = {
    {"CUDA_SUCCESS", "no error"},
    {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
};

static int lookup(CUresult r) {
	switch (r) {
	case 0:
	case 1:
	case 2:
	case 3:
		return r;
	case CUDA_ERROR_INVALID_IMAGE:
		return 4;
	case CUDA_ERROR_NOT_FOUND:
		return 5;
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
