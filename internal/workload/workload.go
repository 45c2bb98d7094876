// Package workload holds the tenant programs that vgpuctl demo runs, each
// with a pure-Go reference that checks the device's result independently.
//
// A Result says what was done and whether it was right; a workload never
// reports success it did not check.
package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/vgpu/vgpu/client"
)

// Result is one workload run by one tenant.
type Result struct {
	Tenant   string
	Workload string
	Work     string        // what was computed, in words and numbers
	Bytes    uint64        // host↔device bytes moved
	Elapsed  time.Duration // from the first allocation to the results back on the host
	Checked  bool          // the device result matched the reference
	Detail   string
	Err      error
}

// Workload runs on a session and checks itself.
type Workload struct {
	Name string
	Run  func(c *client.Client, r *Result) error
}

// Demo returns the three workloads of vgpuctl demo.
func Demo() []Workload {
	return []Workload{
		{"sgemm 512x512x512", func(c *client.Client, r *Result) error { return Sgemm(c, r, 512, 512, 512) }},
		{"saxpy 64 MiB", func(c *client.Client, r *Result) error { return Saxpy(c, r, 16<<20) }},
		{"embedding_bag_sum 256 MiB table, 10000 bags", func(c *client.Client, r *Result) error {
			return EmbeddingBag(c, r, 1<<20, 64, 10000)
		}},
	}
}

// Execute runs w as tenant on a new session at socket.
func Execute(socket, tenant string, w Workload) Result {
	r := Result{Tenant: tenant, Workload: w.Name}
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		r.Err = err
		return r
	}
	defer c.Close()
	r.Err = w.Run(c, &r)
	return r
}

// upload allocates a buffer holding data.
func upload(c *client.Client, s *client.Stream, data []byte) (client.Ptr, error) {
	p, err := c.Malloc(0, uint64(len(data)))
	if err != nil {
		return 0, err
	}
	s.CopyToDevice(p, data)
	return p, nil
}

// Sgemm computes C = alpha·A·B + beta·C (m×k times k×n) on the device.
func Sgemm(c *client.Client, r *Result, m, n, k int) error {
	rng := rand.New(rand.NewPCG(1, uint64(m*n*k)))
	a, b, cm := RandFloats(rng, m*k), RandFloats(rng, k*n), RandFloats(rng, m*n)
	const alpha, beta = 1.5, 0.5
	start := time.Now()
	s := c.Stream()
	var ptrs [3]client.Ptr
	for i, v := range [][]float32{a, b, cm} {
		p, err := upload(c, s, client.Float32Bytes(v))
		if err != nil {
			return err
		}
		ptrs[i] = p
	}
	s.Launch("sgemm", client.I64(int64(m)), client.I64(int64(n)), client.I64(int64(k)), client.F32(alpha),
		client.Buf(ptrs[0]), client.Buf(ptrs[1]), client.F32(beta), client.Buf(ptrs[2]))
	out := make([]byte, 4*m*n)
	s.CopyFromDevice(out, ptrs[2])
	if err := s.Synchronize(); err != nil {
		return err
	}
	r.Elapsed = time.Since(start)
	r.Bytes = uint64(4*(m*k+k*n+m*n) + len(out))
	r.Work = fmt.Sprintf("%.2f GFLOP", 2*float64(m)*float64(n)*float64(k)/1e9)
	want := slices.Clone(cm)
	SgemmRef(m, n, k, alpha, a, b, beta, want)
	return check(r, client.BytesFloat32(out), want, 1e-4)
}

// Saxpy computes y = a·x + y over n floats on the device.
func Saxpy(c *client.Client, r *Result, n int) error {
	rng := rand.New(rand.NewPCG(2, uint64(n)))
	x, y := RandFloats(rng, n), RandFloats(rng, n)
	const alpha = 2.5
	start := time.Now()
	s := c.Stream()
	px, err := upload(c, s, client.Float32Bytes(x))
	if err != nil {
		return err
	}
	py, err := upload(c, s, client.Float32Bytes(y))
	if err != nil {
		return err
	}
	s.Launch("saxpy", client.I64(int64(n)), client.F32(alpha), client.Buf(px), client.Buf(py))
	out := make([]byte, 4*n)
	s.CopyFromDevice(out, py)
	if err := s.Synchronize(); err != nil {
		return err
	}
	r.Elapsed = time.Since(start)
	r.Bytes = uint64(12 * n)
	r.Work = fmt.Sprintf("%d elements", n)
	want := make([]float32, n)
	for i := range want {
		want[i] = alpha*x[i] + y[i]
	}
	return check(r, client.BytesFloat32(out), want, 1e-6)
}

// EmbeddingBag pools nbags bags of random rows of a rows×dim table.
func EmbeddingBag(c *client.Client, r *Result, rows, dim, nbags int) error {
	rng := rand.New(rand.NewPCG(3, uint64(rows)))
	table := RandFloats(rng, rows*dim)
	offsets := make([]int32, nbags)
	var indices []int32
	for b := range nbags {
		offsets[b] = int32(len(indices))
		for range 1 + rng.IntN(40) {
			indices = append(indices, int32(rng.IntN(rows)))
		}
	}
	start := time.Now()
	s := c.Stream()
	pt, err := upload(c, s, client.Float32Bytes(table))
	if err != nil {
		return err
	}
	pi, err := upload(c, s, client.Int32Bytes(indices))
	if err != nil {
		return err
	}
	po, err := upload(c, s, client.Int32Bytes(offsets))
	if err != nil {
		return err
	}
	pout, err := c.Malloc(0, uint64(4*nbags*dim))
	if err != nil {
		return err
	}
	s.Launch("embedding_bag_sum", client.Buf(pt), client.I64(int64(rows)), client.I64(int64(dim)),
		client.Buf(pi), client.I64(int64(len(indices))), client.Buf(po), client.I64(int64(nbags)), client.Buf(pout))
	out := make([]byte, 4*nbags*dim)
	s.CopyFromDevice(out, pout)
	if err := s.Synchronize(); err != nil {
		return err
	}
	r.Elapsed = time.Since(start)
	r.Bytes = uint64(4*(len(table)+len(indices)+len(offsets)) + len(out))
	r.Work = fmt.Sprintf("%d lookups of %d floats", len(indices), dim)
	want := EmbeddingBagSumRef(table, dim, indices, offsets)
	return check(r, client.BytesFloat32(out), want, 1e-5)
}

func check(r *Result, got, want []float32, tol float64) error {
	if err := CloseEnough(got, want, tol); err != nil {
		r.Detail = err.Error()
		return nil
	}
	r.Checked = true
	return nil
}
