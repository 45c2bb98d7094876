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
//     alone, writing nothing: the run goes on with the next. A graph's run
//     (graph.go) stops at its first failed launch instead, and comes with
//     launches it prepared before the run started.
//   - A launch is prepared (its buffers gathered, its slices planned) only
//     after the launch before it in the run has finished, so it sees that
//     launch's results; a graph's launch prepared before is one whose plan
//     cannot see stale bytes (graph.go). The first launch of a run is prepared by the
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
	"github.com/vgpu/vgpu/api/wire"
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
// where the kernel may write them. The launch's arguments come from arena,
// which a batch's launches share.
func (c *conn) checkLaunch(arena *api.LaunchArena, body []byte) (*device, checkedLaunch, error) {
	// api.Decode, with the message's type known: neither the decoder nor
	// l escapes to the heap, and the arena allocates per batch rather than
	// per launch, which counts in a batch of tiny launches.
	var l api.NodeLaunch
	dec := wire.NewDecoder(body)
	arena.DecodeNodeLaunch(dec, &l)
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
	if err := c.checkBuffers(d, k, l.Args); err != nil {
		return nil, checkedLaunch{}, err
	}
	if err := c.trimBuffers(d, k, l.Args); err != nil {
		return nil, checkedLaunch{}, fmt.Errorf("%s: %s: %w", d.Info().Name, l.Kernel, err)
	}
	// Only now, with every argument checked, do aliased frames the kernel
	// may write get memory of their own: nothing of this connection can
	// alias them again before the launch has run.
	if err := c.ownWritten(d, k, l.Args); err != nil {
		return nil, checkedLaunch{}, err
	}
	return d, checkedLaunch{k: k, args: l.Args}, nil
}

// checkBuffers checks every buffer argument of a launch of k on d, whose
// argument kinds are k's, against the frame table: it must lie in frames
// c holds, and where k may write it, in none that is sealed or shared.
func (c *conn) checkBuffers(d *device, k *kernels.Kernel, args []api.NodeArg) error {
	for i, a := range args {
		if a.Kind != api.ArgBuffer {
			continue
		}
		check := d.frames.checkAccess
		if k.Info.Params[i].Access >= api.AccessWrite {
			check = d.frames.checkWrite
		}
		if err := check(c.owner, a.Extents); err != nil {
			return fmt.Errorf("%s: %s argument %d (%s): %w", d.Info().Name, k.Info.Name, i, k.Info.Params[i].Name, err)
		}
	}
	return nil
}

// ownWritten gives the aliased frames (content.go) of every buffer a
// launch of k may write memory of their own, with their bytes, before it
// runs.
func (c *conn) ownWritten(d *device, k *kernels.Kernel, args []api.NodeArg) error {
	for i, a := range args {
		if a.Kind == api.ArgBuffer && k.Info.Params[i].Access >= api.AccessWrite {
			if err := c.node.content.own(c.share, d, a.Extents); err != nil {
				return err
			}
		}
	}
	return nil
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
	d  *device
	ls []checkedLaunch
	// plans, if set, holds launches prepared already (graph.go), by
	// launch; a nil one is prepared at its turn.
	plans []*kernels.Plan
	// phases, if set, is the phase of each launch; else all are
	// api.PhaseOther.
	phases []api.Phase
	// stop says the run ends at its first failed launch: the launches
	// after it are not run, and keep a nil error.
	stop   bool
	failed bool    // a launch failed
	errs   []error // by launch
	ok     int     // launches that succeeded
	next   int     // the launch to prepare next
	cur    int     // the launch being prepared or run
	// The current launch, prepared.
	plan   *kernels.Plan
	finish func() error
}

// launchAll runs ls on d for t, in order, as one run, and returns each
// launch's error.
func (d *device) launchAll(t tenantShare, ls []checkedLaunch) []error {
	return d.runLaunches(t, &launchRun{d: d, ls: ls})
}

// runLaunches runs r, a run of launches on d that none has started, for t,
// and returns each launch's error. t.aside is work done for the run off
// the runners already, charged with its first job.
func (d *device) runLaunches(t tenantShare, r *launchRun) []error {
	r.errs = make([]error, len(r.ls))
	for {
		start := d.sched.clock.now()
		ok := r.advance()
		t.aside += d.sched.clock.now() - start // charged with the job
		if !ok {
			// Preparations that then failed, or had nothing to do,
			// still take the tenant's turn.
			d.chargeAside(t)
			break
		}
		if err := d.sched.runPhased(t, r.step, r.phase); err != nil {
			// The job ended early: a slice panicked or the scheduler
			// closed. The launch in progress failed; the rest go on
			// unless the run stops at a failure.
			r.fail(err)
		}
		t.aside = 0
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

// phase is the phase of the current launch: the job's for the scheduler.
func (r *launchRun) phase() api.Phase {
	if r.phases == nil {
		return api.PhaseOther
	}
	return r.phases[r.cur]
}

// fail records err, not nil, as the current launch's result.
func (r *launchRun) fail(err error) {
	r.errs[r.cur] = err
	r.failed = true
}

// advance prepares the next launch the device accepts that has work to do
// and makes it current; false when none is left, or when one failed and
// the run stops at a failure. A launch the device refuses fails alone; one
// with nothing to do (no slices) succeeds at once.
func (r *launchRun) advance() bool {
	for r.next < len(r.ls) && !(r.stop && r.failed) {
		r.cur = r.next
		r.next++
		var (
			plan   *kernels.Plan
			finish func() error
			err    error
		)
		if r.plans != nil && r.plans[r.cur] != nil {
			plan = r.plans[r.cur]
			r.plans[r.cur] = nil
		} else {
			plan, finish, err = r.d.prepare(r.ls[r.cur])
		}
		switch {
		case err != nil:
			r.fail(err)
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
			if err != nil {
				r.fail(err)
			} else {
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
