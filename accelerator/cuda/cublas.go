package cuda

import (
	"fmt"
	"math"
	"strings"

	"github.com/vgpu/vgpu/api"
)

// CUBLASLibraries are the file names tried, in order, for cuBLAS when no
// path is given, as NVRTCLibraries.
var CUBLASLibraries = toolkitLibraries("libcublas.so.13", "libcublas.so.12", "libcublas.so")

// CUBLAS is the loaded cuBLAS library, which the matmul kernel uses when
// present (opened with dlopen, like the driver). Its handles are per
// context: Device.UseCUBLAS makes one.
type CUBLAS struct {
	path string

	cublasCreate              func(h *uintptr) int32
	cublasDestroy             func(h uintptr) int32
	cublasSetStream           func(h uintptr, s uintptr) int32
	cublasSgemmStridedBatched func(h uintptr, transa, transb int32, m, n, k int32, alpha *float32, a uint64, lda int32, strideA int64,
		b uint64, ldb int32, strideB int64, beta *float32, c uint64, ldc int32, strideC int64, batch int32) int32
}

// LoadCUBLAS opens cuBLAS at path, or when path is empty the first of
// CUBLASLibraries the dynamic loader finds; an error wraps
// api.ErrUnavailable and names libcublas.
func LoadCUBLAS(path string) (*CUBLAS, error) {
	tries := CUBLASLibraries
	if path != "" {
		tries = []string{path}
	}
	lib, p, errs := dlopenFirst(tries)
	if lib != 0 {
		c := &CUBLAS{path: p}
		if missing := bind(lib, []symbol{
			{&c.cublasCreate, "cublasCreate_v2"},
			{&c.cublasDestroy, "cublasDestroy_v2"},
			{&c.cublasSetStream, "cublasSetStream_v2"},
			{&c.cublasSgemmStridedBatched, "cublasSgemmStridedBatched"},
		}); missing != "" {
			return nil, fmt.Errorf("cuBLAS %s lacks %s: %w", p, missing, api.ErrUnavailable)
		}
		return c, nil
	}
	return nil, fmt.Errorf("cuBLAS: cannot load libcublas (tried %s: %s): %w", strings.Join(tries, ", "), strings.Join(errs, "; "), api.ErrUnavailable)
}

// Path is the library loaded.
func (c *CUBLAS) Path() string { return c.path }

func (c *CUBLAS) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("%s: cuBLAS status %d: %w", call, r, api.ErrInternal)
}

// cublasHandle is a cuBLAS handle of one device's context, bound to the
// stream its launches use.
type cublasHandle struct {
	lib *CUBLAS
	h   uintptr
}

// UseCUBLAS makes matmul launches run cuBLAS's SGEMM (strided batched)
// rather than the catalog's kernel, where the sizes allow (matmulBLAS). It
// must be called before the device serves, after UseKernels.
func (d *Device) UseCUBLAS(lib *CUBLAS) error {
	return d.do(func(*Calls) error {
		if d.blas != nil {
			return fmt.Errorf("%s: cuBLAS in use already: %w", d.info.Name, api.ErrInvalidArgument)
		}
		var h uintptr
		if err := lib.check("cublasCreate", lib.cublasCreate(&h)); err != nil {
			return fmt.Errorf("%s: %w", d.info.Name, err)
		}
		if err := lib.check("cublasSetStream", lib.cublasSetStream(h, uintptr(d.streams[0]))); err != nil {
			lib.cublasDestroy(h)
			return fmt.Errorf("%s: %w", d.info.Name, err)
		}
		d.blas = &cublasHandle{lib: lib, h: h}
		return nil
	})
}

// cuBLAS's cublasOperation_t.
const (
	blasN = 0
	blasT = 1
)

// gemmShape is a matmul launch as cuBLAS's column-major SGEMM sees it.
// Row-major c (m x n) = op(a) x op(b) is column-major c^T (n x m) =
// op(b)^T x op(a)^T, and the bytes of a row-major matrix are its transpose
// column-major: so cuBLAS's A is our b and its B our a, m and n swap, and
// each operand is taken as stored when the tenant's is not transposed, and
// transposed when it is (matmulBLAS).
type gemmShape struct {
	transA, transB   int32 // cuBLAS's ops for its A (our b) and B (our a)
	m, n, k          int32 // cuBLAS's: our n, m, k
	lda, ldb, ldc    int32
	strideA, strideB int64 // elements between batches of cuBLAS's A (our b) and B (our a)
	strideC          int64
}

// matmulBLAS maps a matmul launch onto cuBLAS, or says it cannot: sizes
// beyond cuBLAS's int32, or k = 0 (cuBLAS then leaves c to beta, where
// matmul writes zeros; the kernel does that).
func matmulBLAS(m, n, k int64, transA, transB bool, bBatch int64) (gemmShape, bool) {
	if m <= 0 || n <= 0 || k <= 0 || max(m, n, k) > math.MaxInt32 || m*k > math.MaxInt32 || k*n > math.MaxInt32 || m*n > math.MaxInt32 {
		return gemmShape{}, false
	}
	s := gemmShape{m: int32(n), n: int32(m), k: int32(k), ldc: int32(n), strideC: m * n, strideB: m * k}
	// cuBLAS's A is our b, wanted as op(b)^T, n x k column-major.
	if transB { // b stored n x k row-major: column-major k x n, ld k; transpose it
		s.transA, s.lda = blasT, int32(k)
	} else { // b stored k x n row-major: column-major n x k already, ld n
		s.transA, s.lda = blasN, int32(n)
	}
	if bBatch != 1 {
		s.strideA = k * n
	}
	// cuBLAS's B is our a, wanted as op(a)^T, k x m column-major.
	if transA { // a stored k x m row-major: column-major m x k, ld m; transpose it
		s.transB, s.ldb = blasT, int32(m)
	} else { // a stored m x k row-major: column-major k x m already, ld k
		s.transB, s.ldb = blasN, int32(k)
	}
	return s, true
}

// sgemm runs batches [lo, hi) of s on the handle's stream.
func (h *cublasHandle) sgemm(s gemmShape, a, b, c uint64, lo, hi int64) error {
	one, zero := float32(1), float32(0)
	return h.lib.check("cublasSgemmStridedBatched", h.lib.cublasSgemmStridedBatched(h.h, s.transA, s.transB, s.m, s.n, s.k,
		&one, b+uint64(lo*s.strideA*4), s.lda, s.strideA, a+uint64(lo*s.strideB*4), s.ldb, s.strideB,
		&zero, c+uint64(lo*s.strideC*4), s.ldc, s.strideC, int32(hi-lo)))
}

// destroy frees the handle.
func (h *cublasHandle) destroy() error {
	return h.lib.check("cublasDestroy", h.lib.cublasDestroy(h.h))
}
