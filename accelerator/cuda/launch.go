package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"syscall"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Launches on the GPU: each kernel of the catalog is an entry point of the
// compiled module (kernels/*.cu) over a 1-D grid of work items, and a
// launch's plan is that grid cut into ranges of items, one cuLaunchKernel
// per slice, waited for before the slice returns. The node's scheduler
// interleaves tenants between slices; a slice, once launched, runs to its
// end (a GPU does not preempt a kernel for another context's work), so a
// slice's length is what bounds how long one tenant holds the device.

// gpuWorkScale multiplies the work a slice may hold (Prepare's maxWork):
// the node sizes slices in the catalog's element operations to about 70 µs
// of its CPU cores (accelerator's sliceWork), which a GPU does a hundred
// times faster or more, while every slice costs a launch and a stream
// synchronisation (some 10 µs). A guess, not yet measured on a GPU
// (docs/backends.md).
const gpuWorkScale = 256

// threadsPerBlock is the block size of every launch.
const threadsPerBlock = 128

// maxSliceItems bounds a slice's grid (a grid's x dimension may reach
// 2^31-1 blocks; this stays far below, and below an int32 of threads).
const maxSliceItems = 1 << 30

// grid says how many work items a launch of a kernel has and what one
// costs in the catalog's element operations (kernels.Plan's maxWork), from
// its i64 arguments by name. The catalog's checks have passed, so sizes
// are non-negative and their products fit.
var grid = map[string]func(v func(string) int64) (items, cost int64){
	"fill_f32":       func(v func(string) int64) (int64, int64) { return v("n"), 4 },
	"saxpy":          func(v func(string) int64) (int64, int64) { return v("n"), 4 },
	"reduce_sum_f32": func(v func(string) int64) (int64, int64) { return max(v("n"), 1), 256 },
	"sgemm":          func(v func(string) int64) (int64, int64) { return v("m") * v("n"), max(v("k"), 1) },
	"matmul": func(v func(string) int64) (int64, int64) { // tiles of 4 x 4 (blas.cu's MATMUL_TM, _TN)
		return v("batch") * ((v("m") + 3) / 4) * ((v("n") + 3) / 4), 16 * max(v("k"), 1)
	},
	"add":  func(v func(string) int64) (int64, int64) { return v("rows") * v("cols"), 4 },
	"mul":  func(v func(string) int64) (int64, int64) { return v("rows") * v("cols"), 4 },
	"relu": func(v func(string) int64) (int64, int64) { return v("n"), 4 },
	"silu": func(v func(string) int64) (int64, int64) { return v("n"), 32 },
	"gelu": func(v func(string) int64) (int64, int64) { return v("n"), 32 },
	"softmax": func(v func(string) int64) (int64, int64) {
		return v("rows"), max(v("cols"), 1) * 64
	},
	"layer_norm": func(v func(string) int64) (int64, int64) { return v("rows"), max(v("cols"), 1) * 3 },
	"rms_norm":   func(v func(string) int64) (int64, int64) { return v("rows"), max(v("cols"), 1) * 2 },
	"argmax":     func(v func(string) int64) (int64, int64) { return v("rows"), max(v("cols"), 1) },
	"embedding_bag_sum": func(v func(string) int64) (int64, int64) {
		return v("nbags") * v("dim"), max(v("nidx")/max(v("nbags"), 1), 1)
	},
	"embedding": func(v func(string) int64) (int64, int64) { return v("n") * v("dim"), 4 },
	"permute": func(v func(string) int64) (int64, int64) {
		return v("d0") * v("d1") * v("d2") * v("d3"), 4
	},
	"slice":     func(v func(string) int64) (int64, int64) { return v("outer") * v("len") * v("inner"), 4 },
	"concat":    func(v func(string) int64) (int64, int64) { return v("outer") * v("mid") * v("inner"), 4 },
	"kv_append": func(v func(string) int64) (int64, int64) { return v("outer") * v("len") * v("inner"), 4 },
	"attention": func(v func(string) int64) (int64, int64) {
		return v("heads") * v("t") * v("d"), max(3*v("cap")*v("d"), 1)
	},
}

// carried are the kernels that run one thread per slice, which carries a
// float64 accumulator from slice to slice in scratch device memory (an
// extra, last argument): a sum in index order, as the reference's, cut
// into slices so that a long one does not hold the GPU. Their items are
// elements; a slice's cost reflects one thread's speed.
var carried = map[string]bool{"reduce_sum_f32": true}

// gpuBuffer is a buffer argument of a launch on the GPU.
type gpuBuffer struct {
	given []api.Extent // as the launch passed it
	xs    []api.Extent // the prefix the kernel touches
	n     uint64       // bytes of xs
	write bool
	host  []byte // for the checks: the bytes of an index buffer, else a stand-in
	// ptr is the device address the kernel gets: the buffer's own when xs
	// is one extent, else scratch, gathered from xs at the first slice
	// and, if written, scattered back at the last.
	ptr     uint64
	scratch bool
}

// prepareGPU readies a launch of k on the GPU (see the file's comment): it
// runs the catalog's checks (kernels.Kernel.Plan) over stand-ins of the
// buffers, with the real bytes of index buffers, which it reads from the
// device; it writes nothing.
func (d *Device) prepareGPU(k *kernels.Kernel, args []api.NodeArg, maxWork int) (*kernels.Plan, func() error, error) {
	name := k.Info.Name
	kinds := make([]api.ArgKind, len(args))
	wire := make([]api.Arg, len(args))
	for i, a := range args {
		kinds[i], wire[i] = a.Kind, api.Arg{Kind: a.Kind, Bits: a.Bits}
	}
	if err := k.CheckKinds(kinds); err != nil {
		return nil, nil, err
	}
	fn, size := d.funcs[name], grid[name]
	if fn == 0 || size == nil {
		return nil, nil, fmt.Errorf("%s: kernel %s is not in the compiled module: %w", d.info.Name, name, api.ErrUnknownKernel)
	}
	ps := k.Info.Params
	vals := make([]kernels.Value, len(args))
	bufOf := make([]*gpuBuffer, len(args))
	var bufs []*gpuBuffer
	for i, a := range args {
		if vals[i] = kernels.Scalar(a); a.Kind != api.ArgBuffer {
			continue
		}
		if err := d.check(a.Extents); err != nil {
			return nil, nil, fmt.Errorf("%s: argument %d of %s: %w", d.info.Name, i, name, err)
		}
		j := slices.IndexFunc(bufs, func(b *gpuBuffer) bool { return slices.Equal(b.given, a.Extents) })
		if j < 0 {
			n := api.ExtentsLen(a.Extents)
			if need, ok := k.Info.Extent(i, wire); ok && need < n {
				n = need
			}
			b := &gpuBuffer{given: a.Extents, xs: api.ExtentsPrefix(a.Extents, n), n: n}
			if ps[i].DType == api.DTypeI32 && (ps[i].Access == api.AccessRead || ps[i].Access == api.AccessReadWrite) {
				var err error
				if b.host, err = d.gather(b.xs); err != nil {
					return nil, nil, fmt.Errorf("%s: argument %d of %s: %w", d.info.Name, i, name, err)
				}
			}
			bufs = append(bufs, b)
			j = len(bufs) - 1
		}
		bufs[j].write = bufs[j].write || ps[i].Access >= api.AccessWrite
		bufOf[i] = bufs[j]
	}
	release, err := standIns(bufs)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", d.info.Name, name, err)
	}
	for i, b := range bufOf {
		if b != nil {
			vals[i].Buf = b.host
		}
	}
	_, err = k.Plan(vals, math.MaxInt) // the checks; the host's plan is not run
	release()
	if err != nil {
		return nil, nil, err
	}
	if err := disjoint(name, "threads of a GPU kernel would race on them", len(bufs), func(i int) ([]api.Extent, bool) {
		return bufs[i].xs, bufs[i].write
	}); err != nil {
		return nil, nil, err
	}
	for _, b := range bufs {
		b.host = nil
		if len(b.xs) == 1 {
			b.ptr = d.base + b.xs[0].Addr
		} else if b.n > 0 {
			b.scratch = true
		} else {
			b.ptr = d.base // nothing is touched
		}
	}
	v := func(p string) int64 {
		j := slices.IndexFunc(ps, func(q api.Param) bool { return q.Name == p && q.Kind == api.ArgI64 })
		return int64(args[j].Bits)
	}
	l := &gpuLaunch{d: d, bufs: bufs, bufOf: bufOf, args: args}
	if carried[name] {
		l.acc = &gpuBuffer{n: 8, scratch: true}
		l.bufs = append(l.bufs, l.acc)
	}
	work := int64(max(maxWork, 1))
	if work > math.MaxInt64/gpuWorkScale {
		work = math.MaxInt64
	} else {
		work *= gpuWorkScale
	}
	items, cost := size(v)
	per := max(work/cost, 1)
	per = min((per+threadsPerBlock-1)/threadsPerBlock*threadsPerBlock, maxSliceItems)
	l.exec = func(k *Calls, lo, hi int64) error { return l.kernel(k, fn, lo, hi) }
	if name == "matmul" && d.blas != nil {
		if s, ok := matmulBLAS(v("m"), v("n"), v("k"), v("trans_a") == 1, v("trans_b") == 1, v("b_batch")); ok {
			// cuBLAS, in slices of whole matrices of the batch.
			items, cost = v("batch"), v("m")*v("n")*v("k")
			per = max(work/cost, 1)
			l.exec = func(_ *Calls, lo, hi int64) error {
				return d.blas.sgemm(s, bufOf[7].ptr, bufOf[8].ptr, bufOf[9].ptr, lo, hi)
			}
		}
	}
	n := int((items + per - 1) / per)
	return kernels.NewPlan(name, n, func(i int) error {
		lo := int64(i) * per
		return l.run(i == 0, i == n-1, lo, min(lo+per, items))
	}), nil, nil
}

// gpuLaunch is a prepared launch on the GPU.
type gpuLaunch struct {
	d     *Device
	bufs  []*gpuBuffer
	bufOf []*gpuBuffer // by argument; nil for scalars
	args  []api.NodeArg
	// exec queues items [lo, hi) on the device's launch stream.
	exec func(k *Calls, lo, hi int64) error
	// acc is the accumulator of a carried kernel, else nil.
	acc *gpuBuffer
}

// kernel queues items [lo, hi) of the catalog's kernel fn.
func (l *gpuLaunch) kernel(k *Calls, fn Function, lo, hi int64) error {
	vals := make([]uint64, 0, 2+len(l.args))
	vals = append(vals, uint64(lo), uint64(hi))
	for i, a := range l.args {
		if b := l.bufOf[i]; b != nil {
			vals = append(vals, b.ptr)
		} else {
			vals = append(vals, a.Bits) // an i64, or a float32's bits in the low half
		}
	}
	if l.acc != nil {
		return k.Launch(fn, 1, 1, l.d.streams[0], append(vals, l.acc.ptr))
	}
	blocks := uint32((hi - lo + threadsPerBlock - 1) / threadsPerBlock)
	return k.Launch(fn, blocks, threadsPerBlock, l.d.streams[0], vals)
}

// run runs items [lo, hi) and waits for them. The first slice gathers
// the scratch buffers, the last scatters back those written and frees
// them; a failing slice frees them too (the plan stops there).
func (l *gpuLaunch) run(first, last bool, lo, hi int64) error {
	d := l.d
	return d.do(func(k *Calls) (err error) {
		done := last
		defer func() {
			if err != nil || done {
				err = errors.Join(err, l.free(k))
			}
		}()
		if first {
			if err := l.gather(k); err != nil {
				return err
			}
		}
		if err := l.exec(k, lo, hi); err != nil {
			return err
		}
		if err := k.Sync(d.streams[0]); err != nil {
			return err
		}
		if last {
			return l.scatter(k)
		}
		return nil
	})
}

// gather allocates each scratch buffer and copies its extents into it.
func (l *gpuLaunch) gather(k *Calls) error {
	for _, b := range l.bufs {
		if !b.scratch {
			continue
		}
		p, err := k.Alloc(b.n)
		if err != nil {
			return err
		}
		b.ptr = p
		l.d.scratch[p] = true
		off := uint64(0)
		for _, x := range b.xs {
			if x.Len > 0 {
				if err := k.DtoD(p+off, l.d.base+x.Addr, x.Len); err != nil {
					return err
				}
			}
			off += x.Len
		}
	}
	return nil
}

// scatter copies the written scratch buffers back to their extents.
func (l *gpuLaunch) scatter(k *Calls) error {
	for _, b := range l.bufs {
		if !b.scratch || !b.write {
			continue
		}
		off := uint64(0)
		for _, x := range b.xs {
			if x.Len > 0 {
				if err := k.DtoD(l.d.base+x.Addr, b.ptr+off, x.Len); err != nil {
					return err
				}
			}
			off += x.Len
		}
	}
	return nil
}

// free frees the scratch buffers.
func (l *gpuLaunch) free(k *Calls) error {
	var errs []error
	for _, b := range l.bufs {
		if b.scratch && l.d.scratch[b.ptr] {
			delete(l.d.scratch, b.ptr)
			errs = append(errs, k.Free(b.ptr))
		}
	}
	return errors.Join(errs...)
}

// standIns gives each buffer without host bytes a stand-in of its length
// for the catalog's checks, which look at lengths, alignment and where
// buffers lie relative to each other, never at float contents: read-only
// zero pages of one anonymous mapping, so a launch over gigabytes costs no
// host memory. release unmaps them.
func standIns(bufs []*gpuBuffer) (release func(), err error) {
	const page = 4096
	var total uint64
	for _, b := range bufs {
		if b.host == nil {
			total += (b.n/page + 1) * page // never empty, and distinct
		}
	}
	if total == 0 {
		return func() {}, nil
	}
	if total > math.MaxInt {
		return nil, fmt.Errorf("buffers of %d bytes: %w", total, api.ErrInvalidArgument)
	}
	m, err := syscall.Mmap(-1, 0, int(total), syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("host address space for the checks of %d bytes of buffers: %v: %w", total, err, api.ErrOutOfMemory)
	}
	off := uint64(0)
	for _, b := range bufs {
		if b.host == nil {
			b.host = m[off : off+b.n : off+b.n]
			off += (b.n/page + 1) * page
		}
	}
	return func() {
		for _, b := range bufs {
			b.host = nil
		}
		syscall.Munmap(m)
	}, nil
}
