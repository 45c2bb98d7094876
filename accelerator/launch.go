package accelerator

// Kernel launches: checked on arrival, then run through the device's
// scheduler (sched.go) as runs of consecutive launches.
//
// A launch request is a run of one launch; a batch's consecutive launches
// on one device are one run. A run is one job of the scheduler: each of its
// steps runs slices of the run's launches, in order, until it has used
// stepTime of device time or the run is done, so a run of a thousand tiny
// launches costs the scheduler a few dispatches rather than a thousand, and
// its submitter one hand-off to the runner. A step therefore lasts at most
// stepTime plus one slice and the preparation of the launch it moved on to
// (which copies a buffer backed by several runs of memory), and the
// scheduler shares the device between runs step by step as it does between
// single launches slice by slice. Preparations the submitter does are
// charged to the run's tenant too, with the job (tenantShare.aside).
//
// Invariants:
//   - Every launch of a run was checked against its kernel's signature and
//     the frame table before the run started (checkLaunch), and every
//     launch whose arguments the device refuses (sizes, gathering) fails
//     alone, writing nothing: the run goes on with the next.
//   - A launch is prepared (its buffers gathered, its slices planned) only
//     after the launch before it in the run has finished, so it sees that
//     launch's results. The first launch of a run is prepared by the
//     submitter, so a single launch that its checks refuse, or that has
//     nothing to do, never reaches the scheduler; the others are prepared
//     by the runner, in a step. Either way the preparation is device time
//     of the run's tenant: a gather on the submitter's goroutine is
//     charged as if the runner had done it (with the job it is for, or,
//     where the launches prepared failed, with an empty one once what the
//     tenant owes comes to a step or more: chargeAside), without holding
//     up the slices of other tenants meanwhile.
//   - Each launch of a run ends with its own result; the run's submitter
//     waits for the last one.

import (
	"fmt"
	"strings"
	"time"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// stepTime is how long a step of a run goes on to the next slice of its
// launches, measured on the scheduler's clock: well under a slice of a big
// kernel (sliceWork), so that tiny launches share the device as finely as
// big ones do.
const stepTime = 20 * time.Microsecond

// checkedLaunch is a launch that passed the checks that need no device
// memory.
type checkedLaunch struct {
	k    *kernels.Kernel
	args []api.NodeArg
}

// checkLaunch decodes a launch and checks it for c: device, kernel,
// argument kinds, and the frames of every buffer, which must not be sealed
// where the kernel may write them.
func (c *conn) checkLaunch(body []byte) (*device, checkedLaunch, error) {
	// api.Decode, with the message's type known: neither the decoder nor
	// l escapes to the heap, which counts in a batch of tiny launches.
	var l api.NodeLaunch
	dec := api.NewDecoder(body)
	l.Unmarshal(dec)
	if err := dec.Finish(); err != nil {
		return nil, checkedLaunch{}, fmt.Errorf("%v: %w", api.OpNodeLaunch, err)
	}
	d, err := c.device(l.Device)
	if err != nil {
		return nil, checkedLaunch{}, err
	}
	k, err := kernels.Lookup(l.Kernel)
	if err != nil {
		return nil, checkedLaunch{}, err
	}
	kinds := make([]api.ArgKind, len(l.Args))
	for i, a := range l.Args {
		kinds[i] = a.Kind
	}
	if err := k.CheckKinds(kinds); err != nil {
		return nil, checkedLaunch{}, err
	}
	for i, a := range l.Args {
		if a.Kind != api.ArgBuffer {
			continue
		}
		check := d.frames.checkAccess
		if k.Info.Params[i].Access >= api.AccessWrite {
			check = d.frames.checkWrite
		}
		if err := check(c.owner, a.Extents); err != nil {
			return nil, checkedLaunch{}, fmt.Errorf("%s: %s argument %d (%s): %w", d.Info().Name, l.Kernel, i, k.Info.Params[i].Name, err)
		}
	}
	if err := c.trimBuffers(d, k, l.Args); err != nil {
		return nil, checkedLaunch{}, fmt.Errorf("%s: %s: %w", d.Info().Name, l.Kernel, err)
	}
	// Only now, with every argument checked, do aliased frames the kernel
	// may write get memory of their own (content.go): nothing of this
	// connection can alias them again before the launch has run.
	for i, a := range l.Args {
		if a.Kind == api.ArgBuffer && k.Info.Params[i].Access >= api.AccessWrite {
			if err := c.node.content.own(c.share, d, a.Extents); err != nil {
				return nil, checkedLaunch{}, err
			}
		}
	}
	return d, checkedLaunch{k: k, args: l.Args}, nil
}

// trimBuffers cuts each buffer argument of args, already checked whole, to
// the bytes k touches (api.KernelInfo.Extent), so that it is gathered and
// charged only that far. A buffer shorter than that, or whose size the scalars
// leave negative or overflowing, is refused before any of it is gathered:
// the kernel would refuse it after. And the buffers that lie in several
// runs of memory, which preparing the launch copies, may come to no more
// bytes together than the connection holds on d, so one launch's copies
// cost the node no more host memory than the connection's grant.
func (c *conn) trimBuffers(d *device, k *kernels.Kernel, args []api.NodeArg) error {
	var buf [16]api.Arg // a launch's scalars, without a heap allocation
	scalars := buf[:0]
	for _, a := range args {
		scalars = append(scalars, api.Arg{Kind: a.Kind, Bits: a.Bits})
	}
	var gathered uint64
	for i := range args {
		a := &args[i]
		p := k.Info.Params[i]
		if a.Kind != api.ArgBuffer || p.Elem == 0 {
			continue
		}
		need, ok := k.Info.Extent(i, scalars)
		have := api.ExtentsLen(a.Extents)
		switch {
		case !ok:
			return fmt.Errorf("argument %d (%s): its size, %s elements of %d bytes, is negative or overflows: %w",
				i, p.Name, dims(k, p, scalars), p.Elem, api.ErrInvalidArgument)
		case need > have:
			return fmt.Errorf("argument %d (%s) holds %d bytes, but the kernel touches %d elements (%s) of %d bytes: %w",
				i, p.Name, have, need/uint64(p.Elem), dims(k, p, scalars), p.Elem, api.ErrInvalidArgument)
		}
		a.Extents = api.ExtentsPrefix(a.Extents, need)
		if len(a.Extents) > 1 {
			gathered += need
		}
	}
	if gathered == 0 {
		return nil // nothing copied: no frame-table lock on a tiny launch
	}
	if held := d.frames.heldBytes(c.owner); gathered > held {
		return fmt.Errorf("its buffers in several runs of memory come to %d bytes, more than the %d this connection holds: %w",
			gathered, held, api.ErrInvalidArgument)
	}
	return nil
}

// dims names the scalars that size buffer parameter p, with their values,
// such as "m = 4 · k = -1".
func dims(k *kernels.Kernel, p api.Param, scalars []api.Arg) string {
	parts := make([]string, len(p.Dims))
	for j, dim := range p.Dims {
		parts[j] = dim
		for i, q := range k.Info.Params {
			if q.Name == dim && i < len(scalars) {
				parts[j] = fmt.Sprintf("%s = %d", dim, int64(scalars[i].Bits))
			}
		}
	}
	return strings.Join(parts, " · ")
}

// heldBytes is the memory o holds.
func (t *frameTable) heldBytes(o owner) uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return uint64(t.held[o]) * FrameSize
}

// prepare readies l to run on d in slices.
func (d *device) prepare(l checkedLaunch) (*kernels.Plan, func() error, error) {
	workers := sliceWorkers()
	work := sliceWork
	if l.k.Parallel() {
		work *= workers // a slice's work spreads over its workers
	}
	p, finish, err := d.Prepare(l.k, l.args, work)
	if err != nil {
		return nil, nil, err
	}
	p.SetWorkers(workers)
	return p, finish, nil
}

// launchRun is the state of a run of launches on one device, used by one
// goroutine at a time: its submitter, then the scheduler's runner.
type launchRun struct {
	d    *device
	ls   []checkedLaunch
	errs []error // by launch
	ok   int     // launches that succeeded
	next int     // the launch to prepare next
	cur  int     // the launch being prepared or run
	// The current launch, prepared.
	plan   *kernels.Plan
	finish func() error
}

// launchAll runs ls on d for t, in order, as one run, and returns each
// launch's error.
func (d *device) launchAll(t tenantShare, ls []checkedLaunch) []error {
	r := &launchRun{d: d, ls: ls, errs: make([]error, len(ls))}
	for {
		start := d.sched.clock.now()
		ok := r.advance()
		t.aside = d.sched.clock.now() - start // charged with the job
		if !ok {
			// Preparations that then failed, or had nothing to do,
			// still take the tenant's turn.
			d.chargeAside(t)
			break
		}
		if err := d.sched.run(t, r.step); err != nil {
			// The job ended early: a slice panicked or the scheduler
			// closed. The launch in progress failed; the rest go on.
			r.errs[r.cur] = err
		}
	}
	d.launches.Add(uint64(r.ok))
	name := d.Info().Name
	for i, err := range r.errs {
		if err != nil {
			r.errs[i] = fmt.Errorf("%s: %w", name, err)
		}
	}
	return r.errs
}

// advance prepares the next launch the device accepts that has work to do
// and makes it current; false when none is left. A launch the device
// refuses fails alone; one with nothing to do (no slices) succeeds at once.
func (r *launchRun) advance() bool {
	for r.next < len(r.ls) {
		r.cur = r.next
		r.next++
		plan, finish, err := r.d.prepare(r.ls[r.cur])
		switch {
		case err != nil:
			r.errs[r.cur] = err
		case plan.Len() == 0:
			r.ok++
		default:
			r.plan, r.finish = plan, finish
			return true
		}
	}
	return false
}

// step is the run's step for the scheduler: slices of the current launch
// and those after it, until stepTime has passed or the run is done.
func (r *launchRun) step() (completed int, more bool, err error) {
	clock := r.d.sched.clock
	start := clock.now()
	for {
		more, err := r.plan.Step()
		if err == nil && !more && r.finish != nil {
			err = r.finish()
		}
		if err != nil || !more {
			r.errs[r.cur] = err
			if err == nil {
				r.ok++
			}
			completed++
			if !r.advance() {
				return completed, false, nil
			}
		}
		if clock.now()-start >= stepTime {
			return completed, true, nil
		}
	}
}
