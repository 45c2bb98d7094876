package coherence_test

import (
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/coherence"
)

// A coherent page read by one mediator and written by another. The calls
// each side makes stand for the messages between them.
func Example() {
	const obj, page = 1, 0
	lease := time.Second
	home, _ := coherence.NewHome(coherence.HomeConfig{Mode: vocab.ModeCoherent, Pages: 4, Lease: lease})
	reader, _ := coherence.NewCache(64<<20, lease/100) // mediator A
	writer, _ := coherence.NewCache(64<<20, lease/100) // mediator B
	const a, b coherence.CacheID = 1, 2
	var now time.Duration // each side passes its own clock; one here

	// A reads: miss, ReadReq, ReadResp, cached under the lease.
	k := coherence.Key{Object: obj, Page: page}
	if _, _, ok := reader.Lookup(k, now); !ok {
		t := reader.StartRead(k, now)
		g, _ := home.Read(a, page, 0, now)
		cached, _ := reader.Fill(t, g, []byte("old"), now)
		fmt.Println("A read version", g.Version, "cached:", cached)
	}

	// B writes: WriteReq; the home invalidates A's copy.
	_ = writer.StartWrite(obj, page)
	w, _ := home.BeginWrite(b, page, now)
	fmt.Println("invalidate", w.Inval, "for version", w.Version)
	for range w.Inval {
		reader.Invalidate(obj, page, w.Version) // Inval at A ...
		_ = home.InvalAck(a, page, w.Version)   // ... and its InvalAck
	}
	if _, ok := home.Ready(page, now); ok {
		// The node applies the write's data here, then commits and acks.
		c, _ := home.Commit(page)
		_ = writer.FinishWrite(obj, page, c.Version) // WriteAck at B
		fmt.Println("committed version", c.Version)
	}
	_, _, ok := reader.Lookup(k, now)
	fmt.Println("A still has a copy:", ok)
	// Output:
	// A read version 0 cached: true
	// invalidate [1] for version 1
	// committed version 1
	// A still has a copy: false
}
