// Package models is a small set of real models for tests, the demo and the
// benchmarks: a GPT-style decoder (gpt.go) and a DLRM-style inference step
// (dlrm.go), each with seeded random weights, built as tensor graphs from
// the catalog's kernels (docs/graphs.md), and each with a pure-Go
// reference that checks what a vGPU computes.
//
// Invariants:
//   - Weights are a pure function of a model's configuration and seed:
//     every tenant that builds the same model holds the same bytes, which is
//     what lets a node deduplicate them.
//   - The references share no code with the kernels (accelerator/kernels):
//     the decoder's is written from the model's mathematics in float64, so
//     a kernel bug cannot hide in a reference that makes it too. (The DLRM
//     step's reference follows the older kernels' documented order of
//     operations instead, internal/workload, and is checked bit for bit.)
//   - A model runs two ways on a session: as registered graphs (one round
//     trip per invocation) or op by op as stream launches of the same
//     kernels (OpByOp), which is what driver-level remoting can do; both
//     take their operations from the same GraphDef, so they compute the
//     same thing.
package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Weight is one named weight tensor of a model, in float32 as the device
// holds it.
type Weight struct {
	Name  string
	Shape []int64
	Data  []float32
}

// Upload allocates one buffer per weight on device 0 and copies the weights
// in through shared host memory (client.HostAlloc, as a model file is read
// into pinned memory). With hints the buffers are allocated as weights
// (api.HintWeight) and sealed: a node that already holds a whole 2 MiB
// piece of them from another tenant is sent its hash, not its bytes, and
// graphs may bind them. Without hints they are plain buffers, as a driver
// that knows nothing of their meaning would see them.
func Upload(c *client.Client, ws []Weight, hints bool) ([]client.Ptr, error) {
	var o client.AllocOptions
	if hints {
		o.Hint = api.HintWeight
	}
	total := 0
	for _, w := range ws {
		total += 4 * len(w.Data)
	}
	host, err := c.HostAlloc(max(total, 1))
	if err != nil {
		return nil, err
	}
	defer func() {
		if host != nil { // an error before HostFree below
			_ = c.HostFree(host)
		}
	}()
	s := c.Stream()
	ptrs := make([]client.Ptr, len(ws))
	off := 0
	for i, w := range ws {
		if ptrs[i], err = c.MallocWith(0, uint64(4*len(w.Data)), o); err != nil {
			return nil, fmt.Errorf("weight %s: %w", w.Name, err)
		}
		src := host[off : off+copy(host[off:], client.Float32Bytes(w.Data))]
		off += len(src)
		s.CopyToDevice(ptrs[i], src)
	}
	if err := s.Synchronize(); err != nil {
		return nil, fmt.Errorf("copying the weights in: %w", err)
	}
	err = c.HostFree(host)
	host = nil
	if err != nil {
		return nil, err
	}
	if hints {
		for i, p := range ptrs {
			if err := c.Seal(p); err != nil {
				return nil, fmt.Errorf("sealing weight %s: %w", ws[i].Name, err)
			}
		}
	}
	return ptrs, nil
}

// uniform returns n floats drawn uniformly from [-scale, scale).
func uniform(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((rng.Float64()*2 - 1) * scale)
	}
	return v
}

// around returns n floats drawn uniformly from [center-spread, center+spread).
func around(rng *rand.Rand, n int, center, spread float64) []float32 {
	v := uniform(rng, n, spread)
	for i := range v {
		v[i] += float32(center)
	}
	return v
}
