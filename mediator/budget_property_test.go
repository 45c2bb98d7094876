package mediator_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// TestContainerBudgetNeverDrifts drives random allocations, frees and
// disconnects of several sessions of one container against a model of its
// grant: an allocation succeeds exactly when the footprints of the live
// allocations plus its own fit the grant, and what the mediator reports
// held always equals the model's sum, down to zero after the last session;
// and no budget ever releases more than it holds (which the mediator logs
// rather than dies of).
func TestContainerBudgetNeverDrifts(t *testing.T) {
	// Budgets log their drift to the mediator's logger. The check runs
	// once the mediator has closed, its sessions torn down.
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	log.SetOutput(io.Discard)
	drift := test.NewLocal(log)
	t.Cleanup(func() {
		for _, e := range drift.AllEntries() {
			if strings.Contains(e.Message, "drift") {
				t.Errorf("%s: %v", e.Message, e.Data)
			}
		}
	})
	cs := startContainers(t, func(c *mediator.Config) { c.Log = log })
	op := cs.operator(t)
	const grant = 24 << 20
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		id := fmt.Sprintf("prop%d", run)
		r, err := op.Register(api.Register{Container: id, Namespace: "moby", Memory: grant})
		if err != nil {
			rt.Fatal(err)
		}
		defer op.Release("moby", id)
		type live struct {
			p    client.Ptr
			foot uint64
		}
		sessions := map[int]*client.Client{}
		allocs := map[int][]live{}
		held := func() (n uint64) {
			for _, as := range allocs {
				for _, a := range as {
					n += a.foot
				}
			}
			return n
		}
		for step := range rapid.IntRange(1, 30).Draw(rt, "steps") {
			i := rapid.IntRange(0, 2).Draw(rt, "session")
			c := sessions[i]
			if c == nil {
				if c, err = client.Dial(client.Options{Socket: r.Socket}); err != nil {
					rt.Fatalf("step %d: dial: %v", step, err)
				}
				sessions[i] = c
			}
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0, 1: // allocate
				size := rapid.Uint64Range(1, 10<<20).Draw(rt, "size")
				foot := (size + 4095) &^ 4095
				p, err := c.Malloc(0, size)
				fits := held()+foot <= grant
				switch {
				case fits && err != nil:
					rt.Fatalf("step %d: %d bytes with %d of %d held: %v", step, size, held(), grant, err)
				case !fits && !errors.Is(err, api.ErrQuotaExceeded):
					rt.Fatalf("step %d: %d bytes with %d of %d held: %v, want quota exceeded", step, size, held(), grant, err)
				case err == nil:
					allocs[i] = append(allocs[i], live{p, foot})
				}
			case 2: // free one
				if len(allocs[i]) == 0 {
					continue
				}
				k := rapid.IntRange(0, len(allocs[i])-1).Draw(rt, "which")
				if err := c.Free(allocs[i][k].p); err != nil {
					rt.Fatalf("step %d: free: %v", step, err)
				}
				allocs[i] = append(allocs[i][:k], allocs[i][k+1:]...)
			case 3: // disconnect: everything of the session goes
				c.Close()
				delete(sessions, i)
				delete(allocs, i)
				cs.waitHeld(t, "team-a", held())
			}
		}
		for i, c := range sessions {
			c.Close()
			delete(allocs, i)
		}
		cs.waitHeld(t, "team-a", 0)
	})
}

// waitHeld waits until the tenant's sessions hold want bytes.
func (cs *containerSystem) waitHeld(t *testing.T, tenant string, want uint64) {
	t.Helper()
	op := cs.operator(t)
	for range 500 {
		if tenantInfo(t, op, tenant).Allocated == want {
			return
		}
		sleepBriefly()
	}
	t.Fatalf("tenant %s holds %d bytes, want %d", tenant, tenantInfo(t, op, tenant).Allocated, want)
}
