package accelerator

import (
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/api"
)

// reportingDevice is a sim device that says it is a GPU, as vgpu-node's
// cuda devices do through NVML.
type reportingDevice struct {
	*sim.Device
	reads int
}

func (d *reportingDevice) GPUStatus() *api.GPUStatus {
	d.reads++
	return &api.GPUStatus{Index: 7, UUID: "GPU-test", TemperatureC: 40 + uint32(d.reads)}
}

// TestStatusShowsGPU: a device that reports its GPU has it in status, read
// afresh each time; one that does not has none.
func TestStatusShowsGPU(t *testing.T) {
	a, err := sim.New(0, FrameSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sim.New(1, FrameSize)
	if err != nil {
		t.Fatal(err)
	}
	rd := &reportingDevice{Device: a}
	n, err := New("cuda", []Device{rd, b}, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for want := uint32(41); want <= 42; want++ {
		st := n.Status()
		if g := st.Devices[0].GPU; g == nil || g.UUID != "GPU-test" || g.TemperatureC != want {
			t.Errorf("device 0's GPU in status = %+v, want GPU-test at %d°C", g, want)
		}
		if g := st.Devices[1].GPU; g != nil {
			t.Errorf("a sim device reports a GPU: %+v", g)
		}
	}
}
