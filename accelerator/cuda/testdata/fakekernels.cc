/*
 * fakekernels: the kernel catalog's CUDA C (../kernels), compiled for the
 * host with g++ into the fake libcuda (fakecuda.c), so that the fake
 * driver's cuLaunchKernel runs the very code NVRTC compiles for a GPU.
 *
 * CUDA's built-in variables are thread-local globals that fake_run sets
 * for each thread of the grid in turn; __global__ is nothing. A kernel is
 * called through invoke, which reads kernelParams as the driver does: an
 * array of pointers, one per parameter, each to a value of the parameter's
 * type.
 */
#include <math.h>
#include <string.h>
#include <utility>

struct dim3 {
	unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
static inline float __int_as_float(int x) {
	float f;
	memcpy(&f, &x, sizeof f);
	return f;
}

#include "../kernels/common.cuh"
#include "../kernels/attention.cu"
#include "../kernels/blas.cu"
#include "../kernels/elementwise.cu"
#include "../kernels/embedding.cu"
#include "../kernels/layout.cu"
#include "../kernels/rows.cu"

template <typename... A, size_t... I> static void call(void (*f)(A...), void **params, std::index_sequence<I...>) {
	f(*static_cast<A *>(params[I])...);
}

template <typename... A> static void invoke(void (*f)(A...), void **params) {
	call(f, params, std::index_sequence_for<A...>{});
}

struct kernel {
	const char *name;
	void (*run)(void **params);
};

#define K(f) {#f, [](void **p) { invoke(f, p); }}
static const kernel table[] = {
    K(attention), K(fill_f32), K(saxpy),     K(reduce_sum_f32), K(sgemm),     K(matmul),     K(add),
    K(mul),       K(relu),     K(silu),      K(gelu),           K(softmax),   K(layer_norm), K(rms_norm),
    K(argmax),    K(embedding_bag_sum),      K(embedding),      K(permute),   K(slice),      K(concat),
    K(kv_append),
};

extern "C" void *fake_kernel(const char *name) {
	for (const kernel &k : table)
		if (strcmp(k.name, name) == 0)
			return (void *)&k;
	return nullptr;
}

extern "C" int fake_run(void *k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			void **params) {
	gridDim = {gx, gy, gz};
	blockDim = {bx, by, bz};
	for (blockIdx.z = 0; blockIdx.z < gz; blockIdx.z++)
		for (blockIdx.y = 0; blockIdx.y < gy; blockIdx.y++)
			for (blockIdx.x = 0; blockIdx.x < gx; blockIdx.x++)
				for (threadIdx.z = 0; threadIdx.z < bz; threadIdx.z++)
					for (threadIdx.y = 0; threadIdx.y < by; threadIdx.y++)
						for (threadIdx.x = 0; threadIdx.x < bx; threadIdx.x++)
							static_cast<const kernel *>(k)->run(params);
	return 0;
}
