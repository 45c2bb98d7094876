package cuda

import (
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/models"
	"github.com/vgpu/vgpu/internal/systest"
	"github.com/vgpu/vgpu/internal/workload"
)

// TestNodeWorkloads: a node serving a fake GPU, with the kernels compiled
// through the fake NVRTC and matmul through the fake cuBLAS, behind a
// mediator, runs the workloads of vgpuctl demo (smaller) and its GPT
// decoder (graphs of matmul, layer_norm, attention, gelu, softmax,
// embedding, argmax...), each checked by the workload against its pure-Go
// reference: the node's scheduler and graphs over the cuda backend's
// launches.
func TestNodeWorkloads(t *testing.T) {
	f := buildFake(t)
	f.setMemory(128 << 20)
	defer f.setMemory(64 << 20)
	blas, err := LoadCUBLAS(f.cublasPath)
	if err != nil {
		t.Fatal(err)
	}
	drv, _ := load(t)
	d, err := New(drv, 0, 0, 96<<20, "fake0")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.UseKernels(NewCompiler(nvrtcFake(t, f), "")); err != nil {
		d.Close()
		t.Fatal(err)
	}
	if err := d.UseCUBLAS(blas); err != nil {
		d.Close()
		t.Fatal(err)
	}
	m, socket := systest.StartWith(t, systest.Options{Serve: []accelerator.Device{d}, Backend: "cuda"})
	launches, sgemms := f.calls(4), f.sgemms()
	for _, w := range []workload.Workload{
		{Name: "sgemm", Run: func(c *client.Client, r *workload.Result) error { return workload.Sgemm(c, r, 70, 50, 30) }},
		{Name: "saxpy", Run: func(c *client.Client, r *workload.Result) error { return workload.Saxpy(c, r, 1<<16) }},
		{Name: "bags", Run: func(c *client.Client, r *workload.Result) error { return workload.EmbeddingBag(c, r, 4096, 16, 200) }},
		models.DecoderDemo(models.SmallGPT, 4, 3),
	} {
		r := workload.Execute(socket, "tenant-a", w)
		if r.Err != nil || !r.Checked {
			t.Errorf("%s: error %v, checked %v: %s", w.Name, r.Err, r.Checked, r.Detail)
		}
	}
	if f.calls(4) == launches || f.sgemms() == sgemms {
		t.Errorf("%d kernel launches and %d SGEMMs through the driver, want some of each", f.calls(4)-launches, f.sgemms()-sgemms)
	}
	// The node closes the device (load's cleanup checks that it freed
	// everything): stop the mediator first.
	m.Close()
}
