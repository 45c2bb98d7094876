package bench

import (
	"testing"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/systest"
)

// BenchmarkLaunchPath measures the whole launch path in one process: a
// tenant's stream, the mediator and a sim node, each asynchronous tiny
// launch queued by the tenant, batched, translated, gathered into node
// batches and run, one Synchronize per 20 000 (as `vgpuctl bench`'s
// windows do), so that a CPU profile shows every stage's share:
//
//	go test -run xxx -bench LaunchPath -benchmem -cpuprofile cpu.out ./internal/bench/
//
// Allocations are per launch, of all three parts together. Across
// processes the parts run in parallel; here they share one scheduler, so
// the rate is a floor, not the system's.
func BenchmarkLaunchPath(b *testing.B) {
	const perSync = 20000
	socket := systest.Start(b, 1, 64<<20)
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	p, err := c.Malloc(0, 4<<10)
	if err != nil {
		b.Fatal(err)
	}
	s := c.Stream()
	if _, err := launches(s, p, perSync); err != nil { // warm-up
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := launches(s, p, perSync); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*perSync)/b.Elapsed().Seconds(), "launches/s")
	b.ReportMetric(0, "ns/op")
}
