// Command tenant is a small tenant program: it uses its vGPU through the
// client SDK and checks every result on the host. It is the SDK's runnable
// example and the tenant process of the end-to-end tests.
//
// usage: tenant [--socket PATH] [--tenant NAME] [--hold DURATION]
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/vgpu/vgpu/client"
)

func main() {
	socket := flag.String("socket", "", "mediator socket (default $VGPU_SOCKET or "+client.DefaultSocket+")")
	tenant := flag.String("tenant", "", "tenant name (default $VGPU_TENANT)")
	n := flag.Int("n", 1<<20, "vector length")
	hold := flag.Duration("hold", 0, "keep the session and its memory this long before exiting")
	flag.Parse()
	if err := run(*socket, *tenant, *n, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "tenant:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(socket, tenant string, n int, hold time.Duration) error {
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
	px, err := c.Malloc(0, bytes)
	if err != nil {
		return err
	}
	py, err := c.Malloc(0, bytes)
	if err != nil {
		return err
	}
	sum, err := c.Malloc(0, 4)
	if err != nil {
		return err
	}
	s := c.Stream()
	s.CopyToDevice(px, client.Float32Bytes(x))
	s.Launch("fill_f32", client.Buf(py), client.I64(int64(n)), client.F32(1))
	s.Launch("saxpy", client.I64(int64(n)), client.F32(2), client.Buf(px), client.Buf(py)) // y = 2x + 1
	s.Launch("reduce_sum_f32", client.I64(int64(n)), client.Buf(py), client.Buf(sum))
	y := make([]byte, bytes)
	got := make([]byte, 4)
	s.CopyFromDevice(y, py)
	s.CopyFromDevice(got, sum)
	if err := s.Synchronize(); err != nil {
		return err
	}
	var want float64
	for i, v := range client.BytesFloat32(y) {
		if w := 2*x[i] + 1; v != w {
			return fmt.Errorf("y[%d] = %g, want %g", i, v, w)
		}
		want += float64(2*x[i] + 1)
	}
	if g := client.BytesFloat32(got)[0]; g != float32(want) {
		return fmt.Errorf("sum = %g, want %g", g, float32(want))
	}
	if math.IsNaN(want) {
		return fmt.Errorf("reference sum is NaN")
	}
	time.Sleep(hold)
	return nil
}
