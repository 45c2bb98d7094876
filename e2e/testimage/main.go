// Command testimage is the static test program of the root end-to-end tests
// (e2e/root): put into a container image, it uses the container's vGPU
// through the client SDK, runs sgemm on the remote node and checks the
// result bit for bit against a pure-Go reference that follows the kernel's
// documented rounding. It prints "ok" and exits 0 on success.
//
// With --soak it is instead a checked workload that runs until SIGUSR1
// (soak.go), for the tests that kill the mediator under load.
//
// It must build with CGO_ENABLED=0 and import nothing that needs cgo.
//
// usage: testimage [--socket PATH] [--tenant NAME] [--m M] [--n N] [--k K] [--hold DURATION]
//
//	testimage --soak [--socket PATH] [--tenant NAME] [--buffers B] [--pause DURATION]
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
	tenant := flag.String("tenant", "", "tenant name (default $VGPU_TENANT; a container's own socket implies it)")
	m := flag.Int("m", 64, "rows of A and C")
	n := flag.Int("n", 64, "columns of B and C")
	k := flag.Int("k", 64, "columns of A, rows of B")
	hold := flag.Duration("hold", 0, "keep the session and its memory this long before exiting")
	soaking := flag.Bool("soak", false, "write buffers once, then run checked rounds until SIGUSR1 and check every buffer")
	buffers := flag.Int("buffers", 16, "with --soak: buffers written before the first round")
	pause := flag.Duration("pause", 20*time.Millisecond, "with --soak: pause between rounds")
	flag.Parse()
	var err error
	if *soaking {
		err = soak(*socket, *tenant, *buffers, *pause)
	} else {
		err = run(*socket, *tenant, *m, *n, *k, *hold)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testimage:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(socket, tenant string, m, n, k int, hold time.Duration) error {
	if m <= 0 || n <= 0 || k <= 0 {
		return fmt.Errorf("sizes %dx%dx%d: want positive", m, n, k)
	}
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		return err
	}
	defer c.Close()

	const alpha, beta = 1.5, 0.5
	a, b, cm := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = float32(i%17) - 8.25
	}
	for i := range b {
		b[i] = float32(i%13)*0.125 + 1
	}
	for i := range cm {
		cm[i] = float32(i % 7)
	}
	pa, err := c.Malloc(0, uint64(4*len(a)))
	if err != nil {
		return err
	}
	pb, err := c.Malloc(0, uint64(4*len(b)))
	if err != nil {
		return err
	}
	pc, err := c.Malloc(0, uint64(4*len(cm)))
	if err != nil {
		return err
	}
	s := c.Stream()
	s.CopyToDevice(pa, client.Float32Bytes(a))
	s.CopyToDevice(pb, client.Float32Bytes(b))
	s.CopyToDevice(pc, client.Float32Bytes(cm))
	s.Launch("sgemm", client.I64(int64(m)), client.I64(int64(n)), client.I64(int64(k)), client.F32(alpha),
		client.Buf(pa), client.Buf(pb), client.F32(beta), client.Buf(pc))
	out := make([]byte, 4*len(cm))
	s.CopyFromDevice(out, pc)
	if err := s.Synchronize(); err != nil {
		return err
	}
	got := client.BytesFloat32(out)
	want := reference(m, n, k, alpha, a, b, beta, cm)
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("sgemm %dx%dx%d: C[%d][%d] = %g, want %g", m, n, k, i/n, i%n, got[i], want[i])
		}
	}
	time.Sleep(hold)
	return nil
}

// reference is sgemm as the catalog documents it: C[i][j] starts as
// beta*C[i][j], then adds (alpha*A[i][p])*B[p][j] for p ascending, every
// product and sum rounded to float32 (the conversions forbid fused
// multiply-adds).
func reference(m, n, k int, alpha float32, a, b []float32, beta float32, c []float32) []float32 {
	out := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := float32(0)
			if beta != 0 {
				s = float32(beta * c[i*n+j])
			}
			for p := 0; p < k; p++ {
				t := float32(alpha * a[i*k+p])
				s = float32(s + float32(t*b[p*n+j]))
			}
			out[i*n+j] = s
		}
	}
	return out
}
