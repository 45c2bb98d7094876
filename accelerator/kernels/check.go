package kernels

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/vgpu/vgpu/api"
)

// checker validates the arguments of one launch. The first failure sticks
// and later checks return zero values, so a kernel reads straight through
// its checks and tests err once before it writes anything (the pattern of
// wire.Decoder).
type checker struct{ err error }

func (c *checker) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format+": %w", append(args, api.ErrInvalidArgument)...)
	}
}

// size returns the size argument name = v as an int; v must be at least least.
func (c *checker) size(name string, v int64, least int) int {
	switch {
	case c.err != nil:
		return 0
	case v < int64(least) && least == 0:
		c.fail("%s = %d is negative", name, v)
		return 0
	case v < int64(least):
		c.fail("%s = %d, want at least %d", name, v, least)
		return 0
	case v > math.MaxInt:
		// Only reachable where int is 32 bits; there such a size could not
		// index memory anyway.
		c.fail("%s = %d does not fit in an int", name, v)
		return 0
	}
	return int(v)
}

// flag returns the flag argument name = v, which must be 0 or 1.
func (c *checker) flag(name string, v int64) bool {
	if c.err == nil && v != 0 && v != 1 {
		c.fail("%s = %d, want 0 or 1", name, v)
	}
	return c.err == nil && v == 1
}

// fits fails unless the range of n = nName positions from start = startName
// lies in [0, limit = limitName): start + n <= limit, all three sizes.
func (c *checker) fits(startName string, start int, nName string, n int, limitName string, limit int) {
	if c.err == nil && (start > limit || n > limit-start) {
		c.fail("%s + %s = %d + %d exceeds %s = %d", startName, nName, start, n, limitName, limit)
	}
}

// element is what a buffer can hold: the data types of the catalog.
type element interface{ float32 | int32 }

// elemSize is the size, and the alignment, of every element type.
const elemSize = 4

// view returns the first product(dims) elements of buffer param as a []T,
// after checking that the product does not overflow, that buf holds that many
// elements and that it is aligned for T. expr says how the dims combine
// ("m*k"), for messages. An extent of zero elements needs no bytes and no
// alignment, and its view is nil.
func view[T element](c *checker, param string, buf []byte, expr string, dims ...int) []T {
	if c.err != nil {
		return nil
	}
	var zero T
	n, ok := product(dims, math.MaxInt/elemSize)
	switch {
	case !ok:
		c.fail("buffer %s: %s %T overflows int%d bytes", param, describe(expr, dims), zero, strconv.IntSize)
		return nil
	case n == 0:
		return nil
	case len(buf)/elemSize < n:
		c.fail("buffer %s holds %d bytes, %s %T need %d", param, len(buf), describe(expr, dims), zero, n*elemSize)
		return nil
	}
	if off := misalignment(buf); off != 0 {
		c.fail("buffer %s starts %d bytes past a %d-byte boundary; %T data must be aligned", param, off, elemSize, zero)
		return nil
	}
	return viewAs[T](buf, n)
}

// disjoint fails if output out shares a byte with input in: kernels that run
// on several goroutines would otherwise compute a result that depends on
// scheduling.
func disjoint[O, I element](c *checker, outName string, out []O, inName string, in []I) {
	if c.err == nil && overlap(out, in) {
		c.fail("output %s overlaps input %s; the result would depend on thread scheduling", outName, inName)
	}
}

// inPlace fails if output out overlaps input in other than exactly, as the
// same elements. A kernel that computes out[i] from in[i] alone, reading it
// before writing it, may run in place; a shifted overlap would read
// elements it already wrote.
func inPlace(c *checker, outName string, out []float32, inName string, in []float32) {
	if c.err == nil && overlap(out, in) && (len(out) != len(in) || &out[0] != &in[0]) {
		c.fail("output %s overlaps input %s without being the same elements; only exactly in place is allowed", outName, inName)
	}
}

// product multiplies dims, which are not negative, and reports whether the
// result is at most limit. Any zero dim makes the product zero, whatever the
// others are: an empty extent needs no memory.
func product(dims []int, limit int) (int, bool) {
	for _, d := range dims {
		if d == 0 {
			return 0, true
		}
	}
	p := uint64(1)
	for _, d := range dims {
		hi, lo := bits.Mul64(p, uint64(d))
		if hi != 0 || lo > uint64(limit) {
			return 0, false
		}
		p = lo
	}
	return int(p), true
}

// describe renders an extent for messages: "m*k = 512*1024", or "4" when the
// expression is the number itself.
func describe(expr string, dims []int) string {
	vals := make([]string, len(dims))
	for i, d := range dims {
		vals[i] = strconv.Itoa(d)
	}
	if v := strings.Join(vals, "*"); v != expr {
		return expr + " = " + v
	}
	return expr
}

// satMul returns a*b for a, b ≥ 0, or math.MaxInt where that overflows. It
// sizes work estimates, which may exceed what memory could hold (a product
// of three dims) and only need to be large.
func satMul(a, b int) int {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt {
		return math.MaxInt
	}
	return int(lo)
}
