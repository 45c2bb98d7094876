package mediator_test

import (
	"errors"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// TestSmallAllocationsCannotFillTheDevice: a container that spreads 4 KiB
// allocations over many sessions and hints, each taking a 2 MiB frame of
// its own, is held to twice its grant plus a few frames on the device, and
// then refused with out-of-memory, while another tenant's container still
// gets its whole grant.
func TestSmallAllocationsCannotFillTheDevice(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	const grant = 8 << 20
	r, err := op.Register(api.Register{Container: "frag", Namespace: "moby", Memory: grant})
	if err != nil {
		t.Fatal(err)
	}
	hints := []api.Hint{api.HintNone, api.HintWeight, api.HintActivation, api.HintKVCache, api.HintStaging}
	var refused error
	held := 0
	for range 40 {
		c, err := client.Dial(client.Options{Socket: r.Socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		for _, h := range hints {
			if _, err := c.MallocWith(0, 4096, client.AllocOptions{Hint: h}); err != nil {
				refused = err
				break
			}
			held++
		}
		if refused != nil {
			break
		}
	}
	used := cs.nodes[0].Status().Devices[0].Used
	t.Logf("%d allocations of 4 KiB, then %v; the device holds %d MiB", held, refused, used>>20)
	if !errors.Is(refused, api.ErrOutOfMemory) {
		t.Fatalf("after %d allocations of 4 KiB in separate pools: %v, want out of memory", held, refused)
	}
	if limit := uint64(2*grant + 16<<21); used > limit {
		t.Fatalf("a container granted %d MiB holds %d MiB of the device, want at most %d", grant>>20, used>>20, limit>>20)
	}
	other, err := op.Register(api.Register{Container: "other", Namespace: "other", Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(client.Options{Socket: other.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 64<<20); err != nil {
		t.Fatalf("another container's whole grant beside the fragmenting one: %v", err)
	}
}
