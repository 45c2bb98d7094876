package accelerator

// Device work besides kernels, charged to the tenant it is done for.
//
// A fill or a copy between device memory (OpNodeFill, OpNodeCopy, as a
// request or a command of a batch) of more than pieceBytes is a job of the
// connection's tenant on the device's scheduler (sched.go), as a launch is:
// its bytes are cut into pieces of at most pieceBytes, and each step of the
// job moves pieces until stepTime has passed or none is left, as a step of
// a run of launches does (launch.go). So another tenant's kernels run
// between the steps of a big fill, its device time counts in the tenant's
// share, and a compute_max cap holds for fills and copies as it does for
// kernels; its request runs on the connection's executor, as a launch's
// does (waitsForDevice, node.go). A fill or copy of one piece or less runs
// on the connection's goroutine (on the reader, when the connection is
// idle), as work off the runners: a job would cost it a dispatch, more than
// the piece itself takes (a mediator zeroes every small allocation with a
// fill, and a 4 KiB fill takes a few microseconds at most).
//
// Work done on the connection's goroutine for a request, off the runners
// (a small fill or copy; hashing a frame to seal it; copying a frame for a
// dedup, or to give an aliased frame memory of its own before a write or
// before its source is freed, content.go), is charged to the tenant as
// device time (offRunner, chargeOff): the time it took under the content
// index's lock, not any wait for it, is added to what the tenant owes the
// device (account.owed), and once that comes to stepTime or more it is
// charged with an empty job, as a launch's failed preparations are. The
// work runs beside other tenants' slices, but the tenant's next work then
// waits its turn, so a cap holds within one such piece of work per
// connection, and what is owed and not charged yet is less than stepTime
// per tenant.
//
// Invariants:
//   - A request's checks (the frame table) have passed, on the
//     connection's goroutine, before it moves any byte, and content.own has
//     given aliased frames of the destination memory of their own.
//   - A fill or copy leaves device memory as one call of the device would
//     (Device.Fill, Device.Copy, which has memmove semantics): pieces are
//     moved in order, so where destination extents overlap each other the
//     later bytes win, as in one call. A copy of one extent to one extent
//     that overlap is moved piece by piece in the direction that reads
//     every byte before it is overwritten: from the end backwards where
//     the destination lies above the source, else forwards; each piece is
//     a memmove of its own. A copy of several extents whose destination
//     and source share a byte, and that is more than one piece, first
//     snapshots its source, in pieces, into host memory (in the job's
//     steps, not before it is queued), and then writes the destination
//     from the snapshot: cut in place, a piece could read bytes an earlier
//     piece wrote. The snapshot holds at most the bytes the connection
//     holds on the device (frameTable.check), the same bound as a launch's
//     gathered buffers (trimBuffers).
//   - Only a device's error, or the scheduler closing, stops a fill or copy
//     part way; it then may have written some of its pieces.
//   - An error names the device once: a device's own error is returned as
//     it is, others (the scheduler's, lengths that differ) with the
//     device's name.

import (
	"fmt"
	"slices"
	"time"

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
// pieces until stepTime has passed or none is left. An error of move's is
// returned as it is; one of the scheduler's names the device and op.
func (d *device) inSteps(t tenantShare, op string, move func() (more bool, err error)) error {
	clock := d.sched.clock
	var moveErr error
	err := d.sched.run(t, func() (int, bool, error) {
		start := clock.now()
		for {
			more, err := move()
			if err != nil {
				moveErr = err
				return 0, false, err
			}
			if !more {
				return 0, false, nil
			}
			if clock.now()-start >= stepTime {
				return 0, true, nil
			}
		}
	})
	if err != nil && moveErr == nil { // the step did not fail: the scheduler did
		return fmt.Errorf("%s: %s: %w", d.Info().Name, op, err)
	}
	return err
}

// fillFor sets every byte of xs, checked, to v, as device work of t.
func (d *device) fillFor(t tenantShare, xs []api.Extent, v byte) error {
	if api.ExtentsLen(xs) <= pieceBytes {
		return d.offRunner(t, func() error { return d.Fill(xs, v) })
	}
	p := newExtentCursor(xs)
	return d.inSteps(t, "fill", func() (bool, error) {
		err := d.Fill(p.next(pieceBytes), v)
		return p.left > 0, err
	})
}

// copyFor copies src to dst, checked, with memmove semantics even where they
// overlap, as device work of t. Their lengths must be equal.
func (d *device) copyFor(t tenantShare, dst, src []api.Extent) error {
	n := api.ExtentsLen(dst)
	if m := api.ExtentsLen(src); m != n {
		return fmt.Errorf("%s: copy of %d bytes into %d: %w", d.Info().Name, m, n, api.ErrInvalidArgument)
	}
	if n <= pieceBytes {
		return d.offRunner(t, func() error { return d.Copy(dst, src) })
	}
	if len(dst) == 1 && len(src) == 1 {
		return d.copyRun(t, dst[0], src[0])
	}
	to, from := newExtentCursor(dst), newExtentCursor(src)
	if !api.ExtentsOverlap(dst, src) {
		return d.inSteps(t, "copy", func() (bool, error) {
			err := d.Copy(to.next(pieceBytes), from.next(pieceBytes))
			return to.left > 0, err
		})
	}
	var snap []byte // made in the first step, once the job runs
	return d.inSteps(t, "copy", func() (bool, error) {
		if snap == nil {
			snap = make([]byte, 0, n)
		}
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

// copyRun copies the extent src to dst, of equal lengths and checked, piece
// by piece, with memmove semantics even where they overlap: where dst lies
// above src, from the end backwards, so that no piece reads bytes an
// earlier piece wrote; else forwards.
func (d *device) copyRun(t tenantShare, dst, src api.Extent) error {
	n, done := dst.Len, uint64(0)
	back := dst.Addr > src.Addr
	return d.inSteps(t, "copy", func() (bool, error) {
		k := min(pieceBytes, n-done)
		off := done
		if back {
			off = n - done - k
		}
		done += k
		err := d.Copy([]api.Extent{{Addr: dst.Addr + off, Len: k}}, []api.Extent{{Addr: src.Addr + off, Len: k}})
		return done < n, err
	})
}

// timed does work and returns how long it took on d's scheduler's clock.
func (d *device) timed(work func() error) (time.Duration, error) {
	start := d.sched.clock.now()
	err := work()
	return d.sched.clock.now() - start, err
}

// offRunner does work for t on the calling goroutine and charges the time
// it took to t as device time of d, with chargeOff.
func (d *device) offRunner(t tenantShare, work func() error) error {
	took, err := d.timed(work)
	d.chargeOff(t, took)
	return err
}

// chargeOff charges took, device work done for t off the runners, with
// chargeAside.
func (d *device) chargeOff(t tenantShare, took time.Duration) {
	t.aside = took
	if t.ending {
		d.sched.chargeNow(t)
		return
	}
	d.chargeAside(t)
}

// chargeAside charges t.aside, device work done for t off the runners: it
// adds it to what t owes d (scheduler.owe), and once that comes to a step
// or more, charges it in an empty job (scheduler.runCharge: of the phase
// of the tenant's last slice). The job takes the tenant's turn, so its
// next work waits as long as after a slice that long, and a cap holds.
// Shorter work, like a look for a launch left or a small fill, waits for
// nothing: it costs no more than reading its request, and adds up. The job
// fails only if the scheduler closed, when there is nothing left to charge.
func (d *device) chargeAside(t tenantShare) {
	if t.aside = d.sched.owe(t); t.aside > 0 {
		_ = d.sched.runCharge(t)
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
