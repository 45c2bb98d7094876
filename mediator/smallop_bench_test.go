package mediator_test

import (
	"testing"

	"github.com/vgpu/vgpu/mediator"
)

// BenchmarkSmallOpAllocs: one small synchronous operation — a 4-byte
// device→host copy, then synchronize — through tenant, mediator and node in
// one process, with the heap allocations it costs per operation (all three
// sides together), so the figure in docs/datapath.md can be reproduced:
//
//	go test -run xxx -bench SmallOpAllocs -benchtime 20000x ./mediator/
func BenchmarkSmallOpAllocs(b *testing.B) {
	sys := startWith(b, 1<<30, func(c *mediator.Config) { c.StateDir = "" })
	c := sys.dial(b, "plain", 1)
	p, err := c.Malloc(0, 4<<10)
	if err != nil {
		b.Fatal(err)
	}
	s := c.Stream()
	var buf [4]byte
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s.CopyFromDevice(buf[:], p)
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}
