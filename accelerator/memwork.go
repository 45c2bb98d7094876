package accelerator

// Device work besides kernels, charged to the tenant it is done for.
//
// A fill or a copy between device memory (OpNodeFill, OpNodeCopy, as a
// request or a command of a batch) is a job of the connection's tenant on
// the device's scheduler (sched.go), as a launch is: its bytes are cut into
// pieces of at most pieceBytes, and each step of the job moves pieces until
// stepTime has passed or none is left, as a step of a run of launches does
// (launch.go). So another tenant's kernels run between the steps of a big
// fill, its device time counts in the tenant's share, and a compute_max cap
// holds for fills and copies as it does for kernels.
//
// Work done on the connection's goroutine for a request, off the runners
// (hashing a frame to seal it, copying a frame for a dedup, content.go), is
// charged to the tenant as device time with an empty job (offRunner), as a
// launch's failed preparations are: it runs beside other tenants' slices,
// but the tenant's next work then waits its turn, so a cap holds within one
// such piece of work per connection.
//
// Invariants:
//   - A request's checks (the frame table, content.own) have passed, on the
//     connection's goroutine, before its job is queued.
//   - A fill or copy leaves device memory as one call of the device would
//     (Device.Fill, Device.Copy, which has memmove semantics): pieces are
//     moved in order, so where destination extents overlap each other the
//     later bytes win, as in one call. A copy whose destination and source
//     share a byte and that is more than one piece is cut too, but first
//     snapshots its source, in pieces, into host memory, and then writes
//     the destination from the snapshot: cut in place, a piece would read
//     bytes an earlier piece wrote. The snapshot holds at most the bytes
//     the connection holds on the device (frameTable.check), the same
//     bound as a launch's gathered buffers (trimBuffers).
//   - Only a device's error, or the scheduler closing, stops a fill or copy
//     part way; it then may have written some of its pieces.

import (
	"fmt"
	"slices"

	"github.com/vgpu/vgpu/api"
)

// pieceBytes is the most bytes a fill or copy moves in one call of the
// device. On the sim backend, 64 KiB take about 35 µs to fill with a byte
// other than zero (a loop over bytes, the slowest), about 3 µs to copy or
// zero. A step, which moves pieces for stepTime, then lasts at most about
// 55 µs, under a slice of a big kernel (sliceWork, about 70 µs), and a
// step of a copy moves several pieces, so a big copy costs a dispatch per
// stepTime of copying, not per piece. (Pieces of 1 MiB would copy in about
// 50 µs, but take 400 µs to fill.)
const pieceBytes = 64 << 10

// inSteps runs move, which moves the next piece of a fill or copy and says
// whether any is left, as one job of t on d's scheduler: each step moves
// pieces until stepTime has passed or none is left.
func (d *device) inSteps(t tenantShare, move func() (more bool, err error)) error {
	clock := d.sched.clock
	return d.sched.run(t, func() (int, bool, error) {
		start := clock.now()
		for {
			more, err := move()
			if err != nil || !more {
				return 0, false, err
			}
			if clock.now()-start >= stepTime {
				return 0, true, nil
			}
		}
	})
}

// fillFor sets every byte of xs, checked, to v, as device work of t.
func (d *device) fillFor(t tenantShare, xs []api.Extent, v byte) error {
	p := newExtentCursor(xs)
	return d.inSteps(t, func() (bool, error) {
		err := d.Fill(p.next(pieceBytes), v)
		return p.left > 0, err
	})
}

// copyFor copies src to dst, checked, with memmove semantics even where they
// overlap, as device work of t. Their lengths must be equal.
func (d *device) copyFor(t tenantShare, dst, src []api.Extent) error {
	n := api.ExtentsLen(dst)
	if m := api.ExtentsLen(src); m != n {
		return fmt.Errorf("source of %d bytes, destination of %d: %w", m, n, api.ErrInvalidArgument)
	}
	to, from := newExtentCursor(dst), newExtentCursor(src)
	if n <= pieceBytes || !api.ExtentsOverlap(dst, src) {
		return d.inSteps(t, func() (bool, error) {
			err := d.Copy(to.next(pieceBytes), from.next(pieceBytes))
			return to.left > 0, err
		})
	}
	snap := make([]byte, 0, n)
	return d.inSteps(t, func() (bool, error) {
		if from.left > 0 {
			return true, d.Read(from.next(pieceBytes), func(parts ...[]byte) error {
				for _, p := range parts {
					snap = append(snap, p...)
				}
				return nil
			})
		}
		k := min(pieceBytes, uint64(len(snap)))
		err := d.Write(to.next(k), snap[:k])
		snap = snap[k:]
		return to.left > 0, err
	})
}

// offRunner does work for t on the calling goroutine and charges the time
// it took to t as device time of d (tenantShare.aside), with chargeAside.
func (d *device) offRunner(t tenantShare, work func() error) error {
	start := d.sched.clock.now()
	err := work()
	t.aside = d.sched.clock.now() - start
	d.chargeAside(t)
	return err
}

// chargeAside charges t.aside, device work done for t off the runners, in
// an empty job where it took a step or more: the job takes the tenant's
// turn, so its next work waits as long as after a slice that long, and a
// cap holds. Shorter work, like a look for a launch left, costs no more
// than reading its request. The job fails only if the scheduler closed,
// when there is nothing left to charge.
func (d *device) chargeAside(t tenantShare) {
	if t.aside >= stepTime {
		_ = d.sched.run(t, func() (int, bool, error) { return 0, false, nil })
	}
}

// extentCursor hands out the bytes of a list of extents, in order, in
// pieces.
type extentCursor struct {
	xs   []api.Extent // those not handed out yet, the first one cut; a copy
	left uint64       // bytes not handed out yet
}

func newExtentCursor(xs []api.Extent) *extentCursor {
	return &extentCursor{xs: slices.Clone(xs), left: api.ExtentsLen(xs)}
}

// next hands out the extents of the next n bytes; with n at least what is
// left, every extent left, empty ones too, so the device sees them all.
func (c *extentCursor) next(n uint64) []api.Extent {
	if n >= c.left {
		rest := c.xs
		c.xs, c.left = nil, 0
		return rest
	}
	// The head shares c.xs up to its last extent, which is a copy if cut.
	head := api.ExtentsPrefix(c.xs, n)
	i := len(head) - 1
	if cut := head[i].Len; cut < c.xs[i].Len {
		c.xs[i].Addr += cut
		c.xs[i].Len -= cut
		c.xs = c.xs[i:]
	} else {
		c.xs = c.xs[i+1:]
	}
	c.left -= n
	return head
}
