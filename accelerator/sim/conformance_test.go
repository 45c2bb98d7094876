package sim_test

import (
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/accelerator/sim"
)

// TestConformance runs the suite every backend passes; sim computes the
// kernels' references itself, so results must match bit for bit.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, size uint64) accelerator.Device {
		d, err := sim.New(0, size)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}, conformance.Options{})
}
