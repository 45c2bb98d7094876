// The typed views reinterpret device memory, which holds little-endian data,
// as native float32 and int32 values. That is right only on little-endian
// hosts, so on the others the package does not build rather than compute
// wrong numbers.

//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package kernels

import (
	"fmt"
	"unsafe"
)

// misalignment returns how many bytes past a multiple of elemSize b starts.
func misalignment(b []byte) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b))) % elemSize
}

// viewAs returns the first n elements of b as a []T, sharing b's memory.
//
// The conversion is safe because viewAs itself checks that b holds n
// elements and, unless n is 0, starts aligned for T (every element type is
// elemSize bytes with at most that alignment): the view then covers only
// memory that b owns, every element is aligned, and T holds no pointers, so
// the garbage collector needs nothing of the view but the interior pointer
// that keeps b's array alive. A failed check panics, as it is a bug: callers
// check first, in view, to report a typed error.
func viewAs[T element](b []byte, n int) []T {
	if n < 0 || n > len(b)/elemSize || n > 0 && misalignment(b) != 0 {
		panic(fmt.Sprintf("kernels: view of %d %T over %d bytes at misalignment %d", n, T(0), len(b), misalignment(b)))
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// overlap reports whether a and b share a byte of memory.
func overlap[A, B element](a []A, b []B) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	pb := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b))*elemSize && pb < pa+uintptr(len(a))*elemSize
}
