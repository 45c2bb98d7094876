/*
 * fakenvrtc: a stand-in for libnvrtc on hosts without the CUDA toolkit.
 *
 * The cuda package's tests build it with gcc and load it through the same
 * dlopen path as the real library. Its "compiler" checks what the binding
 * passes (the source, its name, the options: a --gpu-architecture=sm_NN
 * is required) and emits, as both PTX and CUBIN, an image that the fake
 * libcuda's cuModuleLoadData reads: a header line and one ".entry NAME"
 * line per `extern "C" __global__ void NAME(` of the source. A source with
 * an `#error` line fails to compile with NVRTC_ERROR_COMPILATION and a log
 * in NVRTC's format quoting it.
 *
 * Test controls: fake_nvrtc_compiles() counts successful compilations;
 * fake_nvrtc_options() returns the last compilation's options, one a line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult;
enum {
	NVRTC_SUCCESS = 0,
	NVRTC_ERROR_OUT_OF_MEMORY = 1,
	NVRTC_ERROR_INVALID_INPUT = 3,
	NVRTC_ERROR_INVALID_PROGRAM = 4,
	NVRTC_ERROR_INVALID_OPTION = 5,
	NVRTC_ERROR_COMPILATION = 6,
};

typedef struct program {
	char *src, *name, *log, *image;
	int compiled;
} *nvrtcProgram;

static int compiles;
static char options[4096];

int fake_nvrtc_compiles(void) { return compiles; }
const char *fake_nvrtc_options(void) { return options; }

const char *nvrtcGetErrorString(nvrtcResult r) {
	switch (r) {
	case NVRTC_SUCCESS:
		return "NVRTC_SUCCESS";
	case NVRTC_ERROR_OUT_OF_MEMORY:
		return "NVRTC_ERROR_OUT_OF_MEMORY";
	case NVRTC_ERROR_INVALID_INPUT:
		return "NVRTC_ERROR_INVALID_INPUT";
	case NVRTC_ERROR_INVALID_PROGRAM:
		return "NVRTC_ERROR_INVALID_PROGRAM";
	case NVRTC_ERROR_INVALID_OPTION:
		return "NVRTC_ERROR_INVALID_OPTION";
	case NVRTC_ERROR_COMPILATION:
		return "NVRTC_ERROR_COMPILATION";
	}
	return "NVRTC_ERROR unknown";
}

nvrtcResult nvrtcVersion(int *major, int *minor) {
	if (!major || !minor)
		return NVRTC_ERROR_INVALID_INPUT;
	*major = 13;
	*minor = 0;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int nheaders,
			       const char *const *headers, const char *const *includes) {
	(void)headers;
	(void)includes;
	if (!p || !src || nheaders != 0)
		return NVRTC_ERROR_INVALID_INPUT;
	struct program *q = calloc(1, sizeof *q);
	if (!q)
		return NVRTC_ERROR_OUT_OF_MEMORY;
	q->src = strdup(src);
	q->name = strdup(name ? name : "default_program");
	*p = q;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p) {
	if (!p || !*p)
		return NVRTC_ERROR_INVALID_PROGRAM;
	free((*p)->src);
	free((*p)->name);
	free((*p)->log);
	free((*p)->image);
	free(*p);
	*p = NULL;
	return NVRTC_SUCCESS;
}

static const char header[] = "// vgpu fake cubin\n";
static const char marker[] = "extern \"C\" __global__ void ";

/* is_kernel says whether line s declares a kernel, written out or through the
 * catalog's VGPU_KERNEL macro (the fake does not preprocess), and where its
 * name starts. */
static int is_kernel(const char *s, const char **name) {
	if (strncmp(s, marker, sizeof marker - 1) == 0) {
		*name = s + sizeof marker - 1;
		return 1;
	}
	if (strncmp(s, "VGPU_KERNEL ", 12) == 0) {
		*name = s + 12;
		return 1;
	}
	return 0;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char *const *opts) {
	if (!p)
		return NVRTC_ERROR_INVALID_PROGRAM;
	if (n < 0 || (n > 0 && !opts))
		return NVRTC_ERROR_INVALID_INPUT;
	int arch = 0;
	options[0] = 0;
	for (int i = 0; i < n; i++) {
		if (strncmp(opts[i], "--gpu-architecture=sm_", 22) == 0 && atoi(opts[i] + 22) > 0)
			arch = 1;
		strncat(options, opts[i], sizeof options - strlen(options) - 2);
		strcat(options, "\n");
	}
	if (!arch)
		return NVRTC_ERROR_INVALID_OPTION;
	free(p->log);
	free(p->image);
	p->log = p->image = NULL;
	size_t cap = strlen(p->src) + sizeof header + 1;
	char *img = malloc(cap);
	if (!img)
		return NVRTC_ERROR_OUT_OF_MEMORY;
	strcpy(img, header);
	int line = 1;
	for (const char *s = p->src; *s; line++) {
		const char *nl = strchr(s, '\n'), *name;
		size_t len = nl ? (size_t)(nl - s) : strlen(s);
		if (strncmp(s, "#error", 6) == 0) {
			size_t m = strlen(p->name) + len + 64;
			p->log = malloc(m);
			snprintf(p->log, m, "%s(%d): error: %.*s\n\n1 error detected in the compilation of \"%s\".\n",
				 p->name, line, (int)len, s, p->name);
			free(img);
			return NVRTC_ERROR_COMPILATION;
		}
		if (is_kernel(s, &name)) {
			size_t k = strcspn(name, "( \n");
			strcat(img, ".entry ");
			strncat(img, name, k);
			strcat(img, "\n");
		}
		s += len + (nl != NULL);
	}
	p->image = img;
	p->log = strdup("");
	p->compiled = 1;
	compiles++;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
	if (!p || !n)
		return NVRTC_ERROR_INVALID_INPUT;
	*n = (p->log ? strlen(p->log) : 0) + 1;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
	if (!p || !log)
		return NVRTC_ERROR_INVALID_INPUT;
	strcpy(log, p->log ? p->log : "");
	return NVRTC_SUCCESS;
}

static nvrtcResult size_of(nvrtcProgram p, size_t *n) {
	if (!p || !n)
		return NVRTC_ERROR_INVALID_INPUT;
	if (!p->compiled)
		return NVRTC_ERROR_INVALID_PROGRAM;
	*n = strlen(p->image) + 1;
	return NVRTC_SUCCESS;
}

static nvrtcResult image(nvrtcProgram p, char *out) {
	if (!p || !out)
		return NVRTC_ERROR_INVALID_INPUT;
	if (!p->compiled)
		return NVRTC_ERROR_INVALID_PROGRAM;
	strcpy(out, p->image);
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) { return size_of(p, n); }
nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *out) { return image(p, out); }
nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n) { return size_of(p, n); }
nvrtcResult nvrtcGetPTX(nvrtcProgram p, char *out) { return image(p, out); }
