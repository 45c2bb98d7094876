package mediator_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// fragment registers a container granted grant bytes in namespace moby and
// has up to sessions sessions each allocate 4 KiB under every hint, each
// allocation taking a chunk of its own, until one is refused; it returns
// how many succeeded and the refusal.
func fragment(t *testing.T, op *client.Operator, id string, grant uint64, sessions int) (int, error) {
	t.Helper()
	r, err := op.Register(api.Register{Container: id, Namespace: "moby", Memory: grant})
	if err != nil {
		t.Fatal(err)
	}
	hints := []api.Hint{api.HintNone, api.HintWeight, api.HintActivation, api.HintKVCache, api.HintStaging}
	held := 0
	for range sessions {
		c, err := client.Dial(client.Options{Socket: r.Socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		for _, h := range hints {
			if _, err := c.MallocWith(0, 4096, client.AllocOptions{Hint: h}); err != nil {
				return held, err
			}
			held++
		}
	}
	return held, nil
}

// TestSmallAllocationsCannotFillTheDevice: a container that spreads 4 KiB
// allocations over many sessions and hints, each taking a 2 MiB frame of
// its own, is held to twice its grant plus a few frames on the device, and
// then refused with out-of-memory, while another tenant's container still
// gets its whole grant.
func TestSmallAllocationsCannotFillTheDevice(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	const grant = 8 << 20
	held, refused := fragment(t, op, "frag", grant, 40)
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

// TestSmallAllocationsCannotFillTheHostStore: an oversubscribing container
// spreading 4 KiB allocations over sessions and hints keeps its grant
// resident and evicts the rest of its chunks to the mediator's host store,
// where it may keep no more than twice what it may allocate, plus a few
// chunks, however little of each it uses.
func TestSmallAllocationsCannotFillTheHostStore(t *testing.T) {
	quota := filepath.Join(t.TempDir(), "over.toml")
	if err := os.WriteFile(quota, []byte("[namespaces]\nmoby = \"over\"\n[tenants.over]\noversubscribe = 2.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs := startContainers(t, func(c *mediator.Config) { c.Quota, c.HostMemory = quota, 1<<30 })
	op := cs.operator(t)
	const grant = 8 << 20 // 16 MiB to allocate at 2×
	held, refused := fragment(t, op, "frag", grant, 40)
	st := cs.med.Status()
	stored := st.HostRAM + st.HostSpilled
	t.Logf("%d allocations of 4 KiB, then %v; the host store holds %d MiB", held, refused, stored>>20)
	if !errors.Is(refused, api.ErrOutOfMemory) {
		t.Fatalf("after %d allocations of 4 KiB in separate pools: %v, want out of memory", held, refused)
	}
	if limit := uint64(2*2*grant + 16<<21); stored > limit {
		t.Fatalf("a container that may allocate %d MiB keeps %d MiB in the host store, want at most %d", 2*grant>>20, stored>>20, limit>>20)
	}
}
