package mediator_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// A container that reads its own view over many connections at once is
// answered SelfInterval apart over all of them, not on each: every answer
// asks the nodes for their status, so connections must not multiply what
// one container makes the nodes do. Another container is not slowed.
func TestSelfPacedPerContainer(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	socket := func(id string) string {
		reply, err := op.Register(api.Register{Container: id, Namespace: "moby", Memory: 8 << 20, Pid: uint32(os.Getpid())})
		if err != nil {
			t.Fatal(err)
		}
		return reply.Socket
	}
	hostile, quiet := socket("hostile"), socket("quiet")
	const conns, each = 8, 2
	views := make([]*client.Operator, conns)
	for i := range views {
		v, err := client.DialOperator(hostile)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		views[i] = v
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, v := range views {
		wg.Go(func() {
			for range each {
				if _, err := v.Self(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	// Meanwhile the other container reads its view at once.
	time.Sleep(mediator.SelfInterval)
	other, err := client.DialOperator(quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	asked := time.Now()
	if _, err := other.Self(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(asked); took > 5*mediator.SelfInterval {
		t.Errorf("another container's view took %v while the first one asked over %d connections", took, conns)
	}
	wg.Wait()
	if took, want := time.Since(start), (conns*each-1)*mediator.SelfInterval; took < want {
		t.Errorf("%d readings over %d connections of one container took %v, want at least %v (%v apart)", conns*each, conns, took, want, mediator.SelfInterval)
	}
}
