// Command tenant is a small tenant program: it uses its vGPU through the
// client SDK and checks every result on the host. It is the SDK's runnable
// example and the tenant process of the end-to-end tests.
//
// usage: tenant [--socket PATH] [--tenant NAME] [--n N] [--window W] [--hold DURATION]
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/vgpu/vgpu/client"
)

func main() {
	socket := flag.String("socket", "", "mediator socket (default $VGPU_SOCKET or "+client.DefaultSocket+")")
	tenant := flag.String("tenant", "", "tenant name (default $VGPU_TENANT)")
	n := flag.Int("n", 1<<20, "vector length")
	window := flag.Int("window", 0, "elements each kernel launch works on (default: all n); smaller windows keep a launch's working set small when the vectors exceed device memory")
	hold := flag.Duration("hold", 0, "keep the session and its memory this long before exiting")
	flag.Parse()
	if *window <= 0 || *window > *n {
		*window = *n
	}
	if err := run(*socket, *tenant, *n, *window, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "tenant:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

// run computes y = 2x + 1 and the sum of y over each window on the device,
// and checks every element and every sum on the host.
func run(socket, tenant string, n, window int, hold time.Duration) error {
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		return err
	}
	defer c.Close()
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i % 1000)
	}
	bytes := uint64(4 * n)
	windows := (n + window - 1) / window
	px, err := c.Malloc(0, bytes)
	if err != nil {
		return err
	}
	py, err := c.Malloc(0, bytes)
	if err != nil {
		return err
	}
	sums, err := c.Malloc(0, uint64(4*windows))
	if err != nil {
		return err
	}
	s := c.Stream()
	s.CopyToDevice(px, client.Float32Bytes(x))
	for w := range windows {
		off, m := uint64(4*w*window), int64(min(window, n-w*window))
		s.Launch("fill_f32", client.Buf(py.Add(off)), client.I64(m), client.F32(1))
		s.Launch("saxpy", client.I64(m), client.F32(2), client.Buf(px.Add(off)), client.Buf(py.Add(off))) // y = 2x + 1
		s.Launch("reduce_sum_f32", client.I64(m), client.Buf(py.Add(off)), client.Buf(sums.Add(uint64(4*w))))
	}
	y := make([]byte, bytes)
	got := make([]byte, 4*windows)
	s.CopyFromDevice(y, py)
	s.CopyFromDevice(got, sums)
	if err := s.Synchronize(); err != nil {
		return err
	}
	ys := client.BytesFloat32(y)
	for i, v := range ys {
		if w := 2*x[i] + 1; v != w {
			return fmt.Errorf("y[%d] = %g, want %g", i, v, w)
		}
	}
	for w, g := range client.BytesFloat32(got) {
		var want float64 // the kernel's documented order: float64, index order, rounded once
		for _, v := range ys[w*window : min(n, (w+1)*window)] {
			want += float64(v)
		}
		if g != float32(want) {
			return fmt.Errorf("sum of window %d = %g, want %g", w, g, float32(want))
		}
	}
	time.Sleep(hold)
	return nil
}
