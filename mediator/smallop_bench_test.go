package mediator_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/mediator"
)

// BenchmarkSmallOpAllocs: one small synchronous operation — a 4-byte
// device→host copy, then synchronize — through tenant, mediator and node in
// one process, with the heap allocations it costs per operation (all three
// sides together) and the process's CPU time per operation (cpu-ns/op,
// user and system, every goroutine's), so the figures in docs/datapath.md
// can be reproduced:
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
	cpu0 := cpuTime(b)
	for range b.N {
		s.CopyFromDevice(buf[:], p)
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
