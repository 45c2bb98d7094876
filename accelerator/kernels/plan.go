package kernels

import (
	"fmt"
	"math"
	"runtime"

	"github.com/vgpu/vgpu/api"
)

// Plan is a checked launch cut into slices, so that a scheduler can run other
// launches between them and no kernel holds a device for long.
//
// Invariants:
//   - Every check of Run has passed when a Plan exists: nothing is written
//     before the first slice runs, and a rejected launch gets no Plan.
//   - Running the slices in order, each once, writes exactly what Run writes,
//     bit for bit: slices split the work along boundaries where the result
//     does not depend on the split (rows, elements, bags), and a reduction
//     carries its accumulator from slice to slice in index order.
//   - A slice does about maxWork element operations or less, except that a
//     slice holds at least the smallest piece a kernel cuts its work into,
//     which may cost more: an element of the vector, elementwise and layout
//     kernels, of embedding and argmax; 4 products for each of up to 64
//     columns of a row of sgemm and matmul; one column of one index of
//     embedding_bag_sum; a row of softmax, layer_norm and rms_norm; a
//     (head, query) row of attention.
//
// A Plan is used by one goroutine at a time (it may change goroutines
// between slices); its slices may use several goroutines inside.
type Plan struct {
	kernel string
	n      int
	// slice runs slice i; or, if even is set, even runs items [lo, hi)
	// for slice i, per items a slice (evenPlan): one closure a launch
	// fewer, which counts for tiny ones.
	slice      func(i, workers int) error
	even       func(lo, hi, workers int) error
	per, items int
	next       int
	workers    int // 0: GOMAXPROCS
}

// SetWorkers bounds the goroutines each later slice may use (n < 1: as
// many as GOMAXPROCS, the default). Results do not depend on it. A node
// uses it to leave host cores to its network path, as a real device would.
func (p *Plan) SetWorkers(n int) { p.workers = max(n, 0) }

// Len is the number of slices; 0 means the launch has nothing to do.
func (p *Plan) Len() int { return p.n }

// Step runs the next slice and reports whether slices remain. After an error
// the launch has stopped part way and Step must not be called again; Step
// after the last slice does nothing.
func (p *Plan) Step() (more bool, err error) {
	if p.next >= p.n {
		return false, nil
	}
	i := p.next
	p.next++
	workers := p.workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if p.even != nil {
		lo := i * p.per
		err = p.even(lo, lo+min(p.per, p.items-lo), workers)
	} else {
		err = p.slice(i, workers)
	}
	if err != nil {
		p.next = p.n
		return false, fmt.Errorf("%s: %w", p.kernel, err)
	}
	return p.next < p.n, nil
}

// Plan checks args like Run and returns the launch cut into slices of about
// maxWork element operations (multiply-adds, adds, or elements stored; a
// memory-bound element of the vector kernels counts as vectorCost). It
// writes nothing. maxWork < 1 is taken as 1.
func (k *Kernel) Plan(args []Value, maxWork int) (*Plan, error) {
	if err := k.checkKinds(len(args), func(i int) api.ArgKind { return args[i].Kind }); err != nil {
		return nil, err
	}
	p, err := k.plan(args, max(maxWork, 1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.Info.Name, err)
	}
	p.kernel = k.Info.Name
	return p, nil
}

// NewPlan is a plan of n slices that slice(i) runs, for a backend whose
// device runs the kernel itself rather than the catalog's Go code
// (accelerator/cuda: one range of a GPU grid per slice). The caller must
// have run the catalog's checks first (Kernel.Plan over stand-ins), since
// a Plan promises that they passed.
func NewPlan(kernel string, n int, slice func(i int) error) *Plan {
	return &Plan{kernel: kernel, n: n, slice: func(i, _ int) error { return slice(i) }}
}

// vectorCost is what one element of a memory-bound vector kernel counts as
// in work: on the sim backend storing an element costs about as much as four
// multiply-adds of sgemm, so slices of either take similar time.
const vectorCost = 4

// expCost is what an element that takes an exponential (or erf) in float64
// counts as in work: measured on the sim backend, about 30 multiply-adds of
// sgemm.
const expCost = 32

// evenPlan cuts items of cost each into slices of at most maxWork (at least
// one item each) and runs fn over each slice's range.
func evenPlan(items, cost, maxWork int, fn func(lo, hi, workers int) error) *Plan {
	per := max(1, maxWork/max(cost, 1))
	n := items / per
	if items%per != 0 {
		n++
	}
	return &Plan{n: n, even: fn, per: per, items: items}
}

// rowPlan cuts rows of cost each into slices of at most maxWork (at least one
// row each) and spreads each slice's rows over the workers; fn computes rows
// [lo, hi), which must not depend on other rows' results.
func rowPlan(rows, cost, maxWork int, fn func(lo, hi int) error) *Plan {
	return evenPlan(rows, cost, maxWork, func(lo, hi, workers int) error {
		return parallelForN(workers, hi-lo, cost, func(l, h int) error { return fn(lo+l, lo+h) })
	})
}

// runsPlan plans a memory-bound kernel that produces runs runs of run
// elements each, in slices of about maxWork/vectorCost elements that may cut
// a run: fn(r, lo, hi) produces elements [lo, hi) of run r. The calls come in
// order, on one goroutine, so fn may carry state from one to the next.
// runs*run must not overflow.
func runsPlan(runs, run, maxWork int, fn func(r, lo, hi int) error) *Plan {
	return evenPlan(runs*run, vectorCost, maxWork, func(lo, hi, _ int) error {
		for e := lo; e < hi; {
			r, off := e/run, e%run
			end := min(run, off+hi-e)
			if err := fn(r, off, end); err != nil {
				return err
			}
			e += end - off
		}
		return nil
	})
}

// whole is a plan of one slice that runs fn.
func whole(fn func() error) *Plan {
	return &Plan{n: 1, slice: func(int, int) error { return fn() }}
}

// unbounded is maxWork for Run: the whole launch in one slice where the
// kernel allows it.
const unbounded = math.MaxInt
