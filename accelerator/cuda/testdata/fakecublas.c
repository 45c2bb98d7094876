/*
 * fakecublas: a stand-in for libcublas on hosts without the CUDA toolkit.
 *
 * The cuda package's tests build it with gcc and load it through the same
 * dlopen path as the real library. cublasSgemmStridedBatched is the
 * reference column-major SGEMM of BLAS over device pointers, which with
 * the fake libcuda (fakecuda.c) are host addresses: it checks the
 * arguments as cuBLAS documents (dimensions, leading dimensions), so the
 * backend's mapping of row-major matmul onto column-major SGEMM runs for
 * real. Each element sums its products in p order from beta*C, rounding
 * each product and sum to float.
 *
 * Test control: fake_cublas_calls() counts successful SGEMM calls.
 */
#include <stdint.h>
#include <stdlib.h>

typedef int cublasStatus_t;
enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_INVALID_VALUE = 7,
};
typedef struct handle {
	void *stream;
} *cublasHandle_t;

static long calls;
long fake_cublas_calls(void) { return calls; }

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
	if (!h)
		return CUBLAS_STATUS_INVALID_VALUE;
	*h = calloc(1, sizeof **h);
	return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	free(h);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, void *s) {
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
					 const float *A, int lda, long long sa, const float *B, int ldb, long long sb,
					 const float *beta, float *C, int ldc, long long sc, int batch) {
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (ta < 0 || ta > 1 || tb < 0 || tb > 1 || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
	    lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) || ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) ||
	    ldc < (m > 1 ? m : 1))
		return CUBLAS_STATUS_INVALID_VALUE;
	for (int b = 0; b < batch; b++) {
		const float *a = A + b * sa, *bb = B + b * sb;
		float *c = C + b * sc;
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++) {
				float acc = *beta == 0 ? 0.0f : *beta * c[i + (long long)j * ldc];
				for (int p = 0; p < k; p++) {
					float x = ta ? a[p + (long long)i * lda] : a[i + (long long)p * lda];
					float y = tb ? bb[j + (long long)p * ldb] : bb[p + (long long)j * ldb];
					float prod = *alpha * x;
					acc = acc + prod * y;
				}
				c[i + (long long)j * ldc] = acc;
			}
	}
	calls++;
	return CUBLAS_STATUS_SUCCESS;
}
