package accelerator

import (
	"fmt"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// batchable says which operations a batch may hold.
func batchable(op wire.Op) bool {
	switch op {
	case api.OpNodeWrite, api.OpNodeFill, api.OpNodeCopy, api.OpNodeLaunch:
		return true
	}
	return false
}

// batch executes the commands of an OpNodeBatch in order, every one of them
// even after one failed, and answers once: empty, or with the error of the
// first command that failed, as an *api.BatchError naming it. Its
// consecutive launches on one device run as one run (launch.go). The
// batch's Stream is unused.
func (c *conn) batch(h wire.Header, body []byte) error {
	var b api.Batch
	if err := decode(h.Op, body, &b); err != nil {
		return err
	}
	var first *api.BatchError
	fail := func(i int, err error) {
		if err != nil && (first == nil || i < first.Index) {
			first = &api.BatchError{Index: i, Op: b.Cmds[i].Op, Err: err}
		}
	}
	// The launches checked but not yet run, all on runDev, and their
	// commands' indexes.
	var (
		runDev *device
		run    = make([]checkedLaunch, 0, len(b.Cmds))
		runCmd = make([]int, 0, len(b.Cmds))
		arena  api.LaunchArena
	)
	flush := func() {
		if len(run) == 0 {
			return
		}
		for j, err := range runDev.launchAll(c.share, run) {
			fail(runCmd[j], err)
		}
		run, runCmd = run[:0], runCmd[:0]
	}
	for i, cmd := range b.Cmds {
		switch {
		case !batchable(cmd.Op):
			fail(i, fmt.Errorf("%v cannot be batched, only %v, %v, %v and %v: %w",
				cmd.Op, api.OpNodeWrite, api.OpNodeFill, api.OpNodeCopy, api.OpNodeLaunch, api.ErrInvalidArgument))
		case cmd.Op == api.OpNodeLaunch:
			d, l, err := c.checkLaunch(&arena, cmd.Body)
			if err != nil {
				fail(i, err)
				continue
			}
			if d != runDev {
				flush()
				runDev = d
			}
			run, runCmd = append(run, l), append(runCmd, i)
		default:
			flush()
			fail(i, c.apply(cmd.Op, cmd.Body))
		}
	}
	flush()
	if first != nil {
		return first
	}
	return c.c.Reply(h)
}
