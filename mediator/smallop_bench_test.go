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
	op := smallOp(b)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for range b.N {
		op()
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// smallOp starts a system without a journal and returns one small
// operation of a session of it: a 4-byte copy from the device, then
// Synchronize.
func smallOp(t testing.TB) func() {
	sys := startWith(t, 1<<30, func(c *mediator.Config) { c.StateDir = "" })
	c := sys.dial(t, "plain", 1)
	p, err := c.Malloc(0, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Stream()
	var buf [4]byte
	return func() {
		s.CopyFromDevice(buf[:], p)
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The small synchronous operation allocates three times a round trip over
// tenant, mediator and node together (docs/datapath.md, "Allocations a
// round trip"): the tenant's inflight, the mediator's completion and the
// device's list of reply parts. A change that adds one to the path fails
// here rather than only in the benchmark's figures.
func TestSmallOpAllocations(t *testing.T) {
	op := smallOp(t)
	op() // the session's first use makes what it keeps
	// Averaged over many, an allocation now and then elsewhere in the
	// process (a timer, the GC) does not count.
	if got := testing.AllocsPerRun(2000, op); got > 3 {
		t.Errorf("%v allocations a small operation, want at most 3", got)
	}
}
