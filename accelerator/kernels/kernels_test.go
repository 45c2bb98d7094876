package kernels

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Test buffers are built with encoding/binary, not the package's views, so
// the tests also check that the kernels read and write little-endian data.

// alloc returns n zero bytes that start at a 4-byte boundary, as device
// allocations do.
func alloc(n int) []byte {
	b := make([]byte, n+elemSize) // room to skip up to 3 bytes and keep one
	off := 0
	for misalignment(b[off:]) != 0 {
		off++
	}
	return b[off : off+n : off+n]
}

// misaligned returns a copy of b that starts one byte past a 4-byte boundary.
func misaligned(b []byte) []byte {
	m := alloc(len(b) + 1)[1:]
	copy(m, b)
	return m
}

func f32Bytes(xs ...float32) []byte {
	b := alloc(4 * len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i32Bytes(xs ...int32) []byte {
	b := alloc(4 * len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func floatsOf(b []byte) []float32 {
	xs := make([]float32, len(b)/4)
	for i := range xs {
		xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}

func bufArg(b []byte) Value       { return Value{Kind: api.ArgBuffer, Buf: b} }
func i64Arg(v int64) Value        { return Value{Kind: api.ArgI64, I64: v} }
func f32Arg(v float32) Value      { return Value{Kind: api.ArgF32, F32: v} }
func f32sArg(xs ...float32) Value { return bufArg(f32Bytes(xs...)) }
func i32sArg(xs ...int32) Value   { return bufArg(i32Bytes(xs...)) }

// tb is what the helpers need of *testing.T and *rapid.T alike.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func mustLookup(t tb, name string) *Kernel {
	t.Helper()
	k, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sameBits fails t unless got and want are equal bit for bit, except that
// any NaN matches any NaN.
func sameBits(t tb, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
			t.Fatalf("%s[%d] = %v (%#x), want %v (%#x)", what, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
}

func TestCatalog(t *testing.T) {
	infos := Catalog()
	var names []string
	for _, info := range infos {
		names = append(names, info.Name)
	}
	want := []string{"add", "argmax", "attention", "concat", "embedding", "embedding_bag_sum", "fill_f32", "gelu",
		"kv_append", "layer_norm", "matmul", "mul", "permute", "reduce_sum_f32", "relu", "rms_norm", "saxpy", "sgemm",
		"silu", "slice", "softmax"}
	if !slices.Equal(names, want) {
		t.Fatalf("Catalog names = %v, want %v", names, want)
	}
	for _, info := range infos {
		k := mustLookup(t, info.Name)
		if k.Info.Doc == "" || len(k.Info.Doc) > wire.MaxString {
			t.Errorf("%s: Doc of %d bytes", info.Name, len(k.Info.Doc))
		}
		for i, p := range info.Params {
			if (p.Kind == api.ArgBuffer) != (p.Access != api.AccessNone) {
				t.Errorf("%s: parameter %d (%s) is %v with access %d", info.Name, i, p.Name, p.Kind, p.Access)
			}
		}
	}
	// The catalog must survive a caller that edits what it was given.
	infos[0].Params[0].Name = "scribbled"
	if Catalog()[0].Params[0].Name == "scribbled" {
		t.Fatal("Catalog shares its parameter lists with callers")
	}
	// The list must round-trip through the wire form.
	var got api.KernelList
	if err := api.Decode(api.Encode(&api.KernelList{Kernels: Catalog()}), &got); err != nil {
		t.Fatal(err)
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := Lookup("dgemm")
	if !errors.Is(err, api.ErrUnknownKernel) || !strings.Contains(err.Error(), `"dgemm"`) {
		t.Fatalf("Lookup(dgemm) = %v, want ErrUnknownKernel naming it", err)
	}
}

func TestCheckKinds(t *testing.T) {
	k := mustLookup(t, "saxpy")
	for _, tc := range []struct {
		kinds []api.ArgKind
		want  string // "" for success
	}{
		{[]api.ArgKind{api.ArgI64, api.ArgF32, api.ArgBuffer, api.ArgBuffer}, ""},
		{[]api.ArgKind{api.ArgI64, api.ArgF32, api.ArgBuffer}, "saxpy takes 4 arguments (n, a, x, y), got 3"},
		{nil, "saxpy takes 4 arguments (n, a, x, y), got 0"},
		{[]api.ArgKind{api.ArgI64, api.ArgI64, api.ArgBuffer, api.ArgBuffer}, "saxpy: argument 1 (a) is i64, want f32"},
		{[]api.ArgKind{api.ArgI64, api.ArgF32, api.ArgBuffer, 9}, "saxpy: argument 3 (y) is kind(9), want buffer"},
	} {
		err := k.CheckKinds(tc.kinds)
		if tc.want == "" {
			if err != nil {
				t.Errorf("CheckKinds(%v) = %v", tc.kinds, err)
			}
			continue
		}
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckKinds(%v) = %v, want ErrInvalidArgument with %q", tc.kinds, err, tc.want)
		}
	}
}

// badCase is a launch that must fail without writing anything.
type badCase struct {
	name   string
	kernel string
	args   []Value
	want   string // a part of the message
}

// on64 returns want, or want32 where int is 32 bits: there a size beyond
// int fails as such, before any product is formed.
func on64(want, want32 string) string {
	if strconv.IntSize == 32 {
		return want32
	}
	return want
}

// sevens returns n floats of 7, for outputs, so that a write of zeros shows.
func sevens(n int) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = 7
	}
	return xs
}

func sgemmArgs() []Value { // m=2, n=3, k=4
	return []Value{i64Arg(2), i64Arg(3), i64Arg(4), f32Arg(1),
		f32sArg(make([]float32, 8)...), f32sArg(make([]float32, 12)...), f32Arg(0), f32sArg(sevens(6)...)}
}

func embeddingArgs() []Value { // rows=5, dim=3, nidx=6, nbags=3
	return []Value{f32sArg(make([]float32, 15)...), i64Arg(5), i64Arg(3),
		i32sArg(0, 4, 1, 1, 3, 2), i64Arg(6), i32sArg(0, 2, 2), i64Arg(3), f32sArg(sevens(9)...)}
}

func with(args []Value, i int, v Value) []Value {
	args = slices.Clone(args)
	args[i] = v
	return args
}

func badCases() []badCase {
	const huge = 1 << 62
	sg, eb := sgemmArgs(), embeddingArgs()
	shared := f32Bytes(make([]float32, 16)...)
	return append([]badCase{
		{"wrong count", "fill_f32", []Value{f32sArg(0), i64Arg(1)}, "fill_f32 takes 3 arguments (x, n, value), got 2"},
		{"wrong kind", "fill_f32", []Value{f32sArg(0), f32Arg(1), f32Arg(1)}, "fill_f32: argument 1 (n) is f32, want i64"},

		{"fill negative n", "fill_f32", []Value{f32sArg(0), i64Arg(-1), f32Arg(1)}, "fill_f32: n = -1 is negative"},
		{"fill short x", "fill_f32", []Value{f32sArg(0, 0), i64Arg(3), f32Arg(1)}, "fill_f32: buffer x holds 8 bytes, n = 3 float32 need 12"},
		{"fill overflow", "fill_f32", []Value{f32sArg(0), i64Arg(math.MaxInt64), f32Arg(1)}, on64("buffer x: n = 9223372036854775807 float32 overflows int64 bytes", "n = 9223372036854775807 does not fit in an int")},
		{"fill misaligned", "fill_f32", []Value{bufArg(misaligned(f32Bytes(0, 0))), i64Arg(2), f32Arg(1)}, "buffer x starts 1 bytes past a 4-byte boundary"},

		{"saxpy negative n", "saxpy", []Value{i64Arg(-5), f32Arg(1), f32sArg(0), f32sArg(0)}, "saxpy: n = -5 is negative"},
		{"saxpy short x", "saxpy", []Value{i64Arg(3), f32Arg(1), f32sArg(0, 0), f32sArg(0, 0, 0)}, "saxpy: buffer x holds 8 bytes, n = 3 float32 need 12"},
		{"saxpy short y", "saxpy", []Value{i64Arg(3), f32Arg(1), f32sArg(0, 0, 0), f32sArg(0, 0)}, "saxpy: buffer y holds 8 bytes, n = 3 float32 need 12"},
		{"saxpy misaligned y", "saxpy", []Value{i64Arg(1), f32Arg(1), f32sArg(0), bufArg(misaligned(f32Bytes(0)))}, "saxpy: buffer y starts 1 bytes past"},

		{"reduce negative n", "reduce_sum_f32", []Value{i64Arg(-1), f32sArg(), f32sArg(0)}, "reduce_sum_f32: n = -1 is negative"},
		{"reduce short x", "reduce_sum_f32", []Value{i64Arg(2), f32sArg(1), f32sArg(0)}, "buffer x holds 4 bytes, n = 2 float32 need 8"},
		{"reduce short out", "reduce_sum_f32", []Value{i64Arg(1), f32sArg(1), bufArg(alloc(3))}, "buffer out holds 3 bytes, 1 float32 need 4"},
		{"reduce misaligned x", "reduce_sum_f32", []Value{i64Arg(1), bufArg(misaligned(f32Bytes(1))), f32sArg(0)}, "buffer x starts 1 bytes past"},

		{"sgemm negative m", "sgemm", with(sg, 0, i64Arg(-2)), "sgemm: m = -2 is negative"},
		{"sgemm negative n", "sgemm", with(sg, 1, i64Arg(-3)), "sgemm: n = -3 is negative"},
		{"sgemm negative k", "sgemm", with(sg, 2, i64Arg(-4)), "sgemm: k = -4 is negative"},
		{"sgemm short a", "sgemm", with(sg, 4, f32sArg(make([]float32, 7)...)), "sgemm: buffer a holds 28 bytes, m*k = 2*4 float32 need 32"},
		{"sgemm short b", "sgemm", with(sg, 5, f32sArg(make([]float32, 11)...)), "sgemm: buffer b holds 44 bytes, k*n = 4*3 float32 need 48"},
		{"sgemm short c", "sgemm", with(sg, 7, f32sArg(make([]float32, 5)...)), "sgemm: buffer c holds 20 bytes, m*n = 2*3 float32 need 24"},
		{"sgemm nil c", "sgemm", with(sg, 7, bufArg(nil)), "sgemm: buffer c holds 0 bytes, m*n = 2*3 float32 need 24"},
		{"sgemm overflow m*k", "sgemm", with(sg, 0, i64Arg(huge)), on64("sgemm: buffer a: m*k = 4611686018427387904*4 float32 overflows int64 bytes", "m = 4611686018427387904 does not fit in an int")},
		{"sgemm overflow k*n", "sgemm", with(sg, 1, i64Arg(huge)), on64("sgemm: buffer b: k*n = 4*4611686018427387904 float32 overflows int64 bytes", "n = 4611686018427387904 does not fit in an int")},
		{"sgemm overflow bytes", "sgemm", with(with(sg, 0, i64Arg(1<<31)), 2, i64Arg(1<<30)), on64("m*k = 2147483648*1073741824 float32 overflows", "m = 2147483648 does not fit in an int")},
		{"sgemm misaligned a", "sgemm", with(sg, 4, bufArg(misaligned(f32Bytes(make([]float32, 8)...)))), "sgemm: buffer a starts 1 bytes past"},
		{"sgemm misaligned b", "sgemm", with(sg, 5, bufArg(misaligned(f32Bytes(make([]float32, 12)...)))), "sgemm: buffer b starts 1 bytes past"},
		{"sgemm misaligned c", "sgemm", with(sg, 7, bufArg(misaligned(f32Bytes(make([]float32, 6)...)))), "sgemm: buffer c starts 1 bytes past"},
		{"sgemm c is a", "sgemm", with(with(sg, 4, bufArg(shared)), 7, bufArg(shared)), "sgemm: output c overlaps input a"},
		{"sgemm c inside b", "sgemm", with(with(sg, 5, bufArg(shared)), 7, bufArg(shared[20:])), "sgemm: output c overlaps input b"},
		{"sgemm wrong kind", "sgemm", with(sg, 3, i64Arg(1)), "sgemm: argument 3 (alpha) is i64, want f32"},

		{"embedding negative rows", "embedding_bag_sum", with(eb, 1, i64Arg(-1)), "embedding_bag_sum: rows = -1 is negative"},
		{"embedding zero dim", "embedding_bag_sum", with(eb, 2, i64Arg(0)), "embedding_bag_sum: dim = 0, want at least 1"},
		{"embedding negative nidx", "embedding_bag_sum", with(eb, 4, i64Arg(-6)), "nidx = -6 is negative"},
		{"embedding negative nbags", "embedding_bag_sum", with(eb, 6, i64Arg(-3)), "nbags = -3 is negative"},
		{"embedding no bags", "embedding_bag_sum", with(eb, 6, i64Arg(0)), "nbags = 0 but nidx = 6"},
		{"embedding short table", "embedding_bag_sum", with(eb, 0, f32sArg(make([]float32, 14)...)), "buffer table holds 56 bytes, rows*dim = 5*3 float32 need 60"},
		{"embedding short indices", "embedding_bag_sum", with(eb, 3, i32sArg(0, 4, 1, 1, 3)), "buffer indices holds 20 bytes, nidx = 6 int32 need 24"},
		{"embedding short offsets", "embedding_bag_sum", with(eb, 5, i32sArg(0, 2)), "buffer offsets holds 8 bytes, nbags = 3 int32 need 12"},
		{"embedding short out", "embedding_bag_sum", with(eb, 7, f32sArg(make([]float32, 8)...)), "buffer out holds 32 bytes, nbags*dim = 3*3 float32 need 36"},
		{"embedding overflow table", "embedding_bag_sum", with(eb, 1, i64Arg(huge)), on64("buffer table: rows*dim = 4611686018427387904*3 float32 overflows", "rows = 4611686018427387904 does not fit in an int")},
		{"embedding overflow dim", "embedding_bag_sum", with(eb, 2, i64Arg(huge)), on64("buffer table: rows*dim = 5*4611686018427387904 float32 overflows", "dim = 4611686018427387904 does not fit in an int")},
		{"embedding overflow out", "embedding_bag_sum", with(with(eb, 1, i64Arg(0)), 2, i64Arg(huge)), on64("buffer out: nbags*dim = 3*4611686018427387904 float32 overflows", "dim = 4611686018427387904 does not fit in an int")},
		{"embedding overflow nbags", "embedding_bag_sum", with(eb, 6, i64Arg(math.MaxInt64)), on64("buffer offsets: nbags = 9223372036854775807 int32 overflows", "nbags = 9223372036854775807 does not fit in an int")},
		{"embedding misaligned table", "embedding_bag_sum", with(eb, 0, bufArg(misaligned(f32Bytes(make([]float32, 15)...)))), "buffer table starts 1 bytes past"},
		{"embedding misaligned indices", "embedding_bag_sum", with(eb, 3, bufArg(misaligned(i32Bytes(0, 4, 1, 1, 3, 2)))), "buffer indices starts 1 bytes past a 4-byte boundary; int32 data must be aligned"},
		{"embedding misaligned offsets", "embedding_bag_sum", with(eb, 5, bufArg(misaligned(i32Bytes(0, 2, 2)))), "buffer offsets starts 1 bytes past"},
		{"embedding misaligned out", "embedding_bag_sum", with(eb, 7, bufArg(misaligned(f32Bytes(make([]float32, 9)...)))), "buffer out starts 1 bytes past"},
		{"embedding first offset", "embedding_bag_sum", with(eb, 5, i32sArg(1, 2, 2)), "offsets[0] = 1, want 0"},
		{"embedding decreasing offsets", "embedding_bag_sum", with(eb, 5, i32sArg(0, 3, 2)), "offsets[2] = 2 is less than offsets[1] = 3"},
		{"embedding offset past nidx", "embedding_bag_sum", with(eb, 5, i32sArg(0, 2, 7)), "offsets[2] = 7 exceeds nidx = 6"},
		{"embedding negative offset", "embedding_bag_sum", with(eb, 5, i32sArg(0, -1, 2)), "offsets[1] = -1 is less than offsets[0] = 0"},
		{"embedding negative index", "embedding_bag_sum", with(eb, 3, i32sArg(0, 4, 1, -1, 3, 2)), "indices[3] = -1 is outside [0, rows = 5)"},
		{"embedding index = rows", "embedding_bag_sum", with(eb, 3, i32sArg(0, 4, 1, 1, 3, 5)), "indices[5] = 5 is outside [0, rows = 5)"},
		{"embedding index past empty table", "embedding_bag_sum", with(eb, 1, i64Arg(0)), "indices[0] = 0 is outside [0, rows = 0)"},
		{"embedding out is table", "embedding_bag_sum", with(with(eb, 0, bufArg(shared)), 7, bufArg(shared)), "output out overlaps input table"},
		{"embedding out over indices", "embedding_bag_sum", with(with(eb, 3, bufArg(shared[8:32])), 7, bufArg(shared[:36])), "output out overlaps input indices"},
		{"embedding out over offsets", "embedding_bag_sum", with(with(eb, 5, bufArg(shared[32:44])), 7, bufArg(shared[:36])), "output out overlaps input offsets"},
	}, modelBadCases()...)
}

// TestBadInputs checks that each bad launch fails with ErrInvalidArgument, a
// message naming the values, and every buffer as it was.
func TestBadInputs(t *testing.T) {
	for _, tc := range badCases() {
		t.Run(tc.name, func(t *testing.T) {
			k := mustLookup(t, tc.kernel)
			var before [][]byte
			for _, a := range tc.args {
				before = append(before, bytes.Clone(a.Buf))
			}
			err := k.Run(tc.args)
			if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want ErrInvalidArgument with %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), tc.kernel) {
				t.Errorf("error %q does not start with the kernel's name", err)
			}
			for i, a := range tc.args {
				if !bytes.Equal(a.Buf, before[i]) {
					t.Errorf("argument %d written by a failed launch", i)
				}
			}
		})
	}
}

// TestEmbeddingChecksAllIndicesBeforeWriting puts the bad index in the last
// bag, after a good one, which a kernel that checked as it went would have
// written.
func TestEmbeddingChecksAllIndicesBeforeWriting(t *testing.T) {
	out := f32Bytes(7, 7, 7, 7)
	err := mustLookup(t, "embedding_bag_sum").Run([]Value{
		f32sArg(1, 2, 3, 4), i64Arg(2), i64Arg(2),
		i32sArg(0, 1, 2), i64Arg(3), i32sArg(0, 2), i64Arg(2), bufArg(out)})
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "indices[2] = 2") {
		t.Fatalf("Run = %v", err)
	}
	sameBits(t, "out", floatsOf(out), []float32{7, 7, 7, 7})
}

// Every buffer parameter declares its extent in terms of the kernel's own
// integer parameters, so a mediator can make just that much resident, and
// its element type, which a graph's tensor must have.
func TestCatalogExtentsNameIntegerParameters(t *testing.T) {
	for _, k := range Catalog() {
		ints := map[string]bool{}
		for _, p := range k.Params {
			if p.Kind == api.ArgI64 {
				ints[p.Name] = true
			}
		}
		for _, p := range k.Params {
			if p.Kind != api.ArgBuffer {
				continue
			}
			if p.Elem == 0 {
				t.Errorf("%s.%s: no element size", k.Name, p.Name)
			}
			if want := wantDType(k.Name, p.Name); p.DType != want || p.Elem != uint8(p.DType.Size()) {
				t.Errorf("%s.%s: %v of %d bytes, want %v", k.Name, p.Name, p.DType, p.Elem, want)
			}
			for _, d := range p.Dims {
				if !ints[d] {
					t.Errorf("%s.%s: dimension %q is not an integer parameter", k.Name, p.Name, d)
				}
			}
		}
	}
}

// wantDType is the element type of buffer param of kernel: int32 for
// indices, float32 for the rest.
func wantDType(kernel, param string) api.DType {
	switch kernel + "." + param {
	case "embedding_bag_sum.indices", "embedding_bag_sum.offsets", "embedding.ids", "argmax.out":
		return api.DTypeI32
	}
	return api.DTypeF32
}

// The vector, elementwise and layout kernels run a slice on one goroutine,
// so a node must not size their slices for all its workers; sgemm, matmul,
// embedding_bag_sum and the row kernels of models spread a slice over them.
func TestKernelParallel(t *testing.T) {
	want := map[string]bool{"fill_f32": false, "saxpy": false, "reduce_sum_f32": false, "sgemm": true, "embedding_bag_sum": true,
		"matmul": true, "softmax": true, "layer_norm": true, "rms_norm": true, "attention": true,
		"add": false, "mul": false, "relu": false, "gelu": false, "silu": false, "embedding": false,
		"permute": false, "slice": false, "concat": false, "kv_append": false, "argmax": false}
	for _, k := range all {
		if w, ok := want[k.Info.Name]; !ok || k.Parallel() != w {
			t.Errorf("%s: Parallel() = %v, want %v (known: %v)", k.Info.Name, k.Parallel(), w, ok)
		}
	}
}
