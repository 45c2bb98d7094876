//go:build cgo

package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/internal/fakegpu"
)

// TestCUDANodeOnFakeGPU runs the real vgpu-node --backend cuda binary on
// the fake NVIDIA libraries (internal/fakegpu: libcuda, libnvrtc,
// libcublas and libnvidia-ml on LD_LIBRARY_PATH, one GPU over host
// memory), behind a real vgpu-mediator: the node discovers the GPU
// through go-nvml, maps its frames and builds its kernels through the
// driver binding, and serves vgpuctl demo's workloads, each checked
// against its reference; vgpuctl status shows the GPU as the fake NVML
// reads it. What only a GPU shows is left to scripts/gpu-check.
func TestCUDANodeOnFakeGPU(t *testing.T) {
	libs := fakegpu.Build(t)
	const gpuMemory = 1280 << 20
	env := []string{"LD_LIBRARY_PATH=" + libs.Dir, "VGPU_FAKE_GPU_MEMORY=" + strconv.Itoa(gpuMemory)}
	addr := freePort(t)
	node := startNodeWith(t, env, addr, "--backend", "cuda", "--memory", "1GiB", "--kernel-cache", t.TempDir(), "--log-level", "info")
	// The kernels run on the (fake) GPU, built by the fake NVRTC, and
	// matmul by the fake cuBLAS: not the host fallback.
	if out := node.out.String(); !strings.Contains(out, "serving GPU") || !strings.Contains(out, "gpu, matmul by cuBLAS") {
		t.Fatalf("the node does not serve the GPU with its kernels and cuBLAS:\n%s", out)
	}
	socket := startMediator(t, addr)

	out, err := run(t, "vgpuctl", "--socket", socket, "demo")
	if err != nil {
		t.Fatalf("vgpuctl demo: %v\n%s", err, out)
	}
	if n := strings.Count(out, "passed"); n != 4 {
		t.Fatalf("want 4 passed checks, got %d:\n%s", n, out)
	}

	st := status(t, socket)
	if len(st.Nodes) != 1 || len(st.Nodes[0].Devices) != 1 {
		t.Fatalf("status: want one node of one device, got %+v", st.Nodes)
	}
	d := st.Nodes[0].Devices[0]
	const uuid = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"
	if !strings.Contains(d.Name, "vgpu fake GPU") || !strings.Contains(d.Name, uuid) || d.Memory != 1<<30 || d.Launches == 0 {
		t.Errorf("device %q of %d bytes and %d launches, want the fake GPU's name and UUID, 1 GiB and the demo's launches", d.Name, d.Memory, d.Launches)
	}
	g := d.GPU
	if g == nil {
		t.Fatalf("device %q has no GPU status", d.Name)
	}
	if g.Index != 0 || g.UUID != uuid || g.PCIBusID != "00000000:19:00.0" || g.MIG != "disabled" || g.Memory != gpuMemory ||
		g.MemoryUsed != 5<<20 || g.Utilization != 37 || g.TemperatureC != 41 || g.PowerMilliwatts != 123456 ||
		g.ECCCorrected != 3 || g.ECCUncorrected != 0 || len(g.Unsupported) != 0 || g.Error != "" {
		t.Errorf("GPU status %+v, want the fake NVML's GPU and readings", *g)
	}
	// The operator's table shows the same readings.
	out, err = run(t, "vgpuctl", "--socket", socket, "status", "-o", "wide")
	if err != nil {
		t.Fatalf("vgpuctl status: %v\n%s", err, out)
	}
	for _, want := range []string{uuid, "00000000:19:00.0", "37%", "41°C", "123 W", "3/0"} {
		if !strings.Contains(out, want) {
			t.Errorf("vgpuctl status -o wide does not show %q:\n%s", want, out)
		}
	}
	waitFor(t, "all memory released", func() bool { return idle(status(t, socket)) })
}
