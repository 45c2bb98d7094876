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
	"github.com/vgpu/vgpu/memory"
)

// Weight is one named weight tensor of a model, in float32 as the device
// holds it.
type Weight struct {
	Name  string
	Shape []int64
	Data  []float32
}

// weightAlign aligns each weight in its model's allocation, as a GPU
// allocator aligns buffers (and a graph's arena its tensors), so that
// vectorised kernels may assume it.
const weightAlign = 256

// Upload copies a model's weights into one allocation on device 0, each at
// an offset aligned to weightAlign, in one copy from shared host memory
// (client.HostAlloc, as a model file is read into pinned memory), and
// returns each weight's address: ptrs[0], the first weight's, is the
// allocation's start (what Free takes).
//
// With hints the allocation is a weight (api.HintWeight), its size
// rounded up to whole frames (memory.FrameSize) with zeros, and sealed. A
// node deduplicates sealed weights by whole frames, and an allocation of
// whole frames starts on one, so every byte of the model is in a frame
// that a node already holding the model from another tenant is sent the
// hash of, not the bytes: each tensor alone, or a last partial frame,
// would be sent by every tenant. Graphs bind each weight at its address.
// Without hints the allocation is a plain buffer of just the weights'
// bytes, as a driver that knows nothing of their meaning would see them.
func Upload(c *client.Client, ws []Weight, hints bool) ([]client.Ptr, error) {
	if len(ws) == 0 {
		return nil, fmt.Errorf("upload of no weights: %w", api.ErrInvalidArgument)
	}
	offs := make([]int, len(ws))
	size := 0
	for i, w := range ws {
		offs[i] = (size + weightAlign - 1) &^ (weightAlign - 1)
		size = offs[i] + 4*len(w.Data)
	}
	var o client.AllocOptions
	if hints {
		o.Hint = api.HintWeight
		size = (size + memory.FrameSize - 1) &^ (memory.FrameSize - 1)
	}
	host, err := c.HostAlloc(size)
	if err != nil {
		return nil, err
	}
	defer func() {
		if host != nil { // an error before HostFree below
			_ = c.HostFree(host)
		}
	}()
	// The gaps and the padding are zeros: every tenant's frames of the
	// same model then hold the same bytes.
	clear(host)
	for i, w := range ws {
		copy(host[offs[i]:], client.Float32Bytes(w.Data))
	}
	base, err := c.MallocWith(0, uint64(size), o)
	if err != nil {
		return nil, fmt.Errorf("weights of %d bytes: %w", size, err)
	}
	s := c.Stream()
	s.CopyToDevice(base, host)
	if err := s.Synchronize(); err != nil {
		return nil, fmt.Errorf("copying the weights in: %w", err)
	}
	err = c.HostFree(host)
	host = nil
	if err != nil {
		return nil, err
	}
	if hints {
		if err := c.Seal(base); err != nil {
			return nil, fmt.Errorf("sealing the weights: %w", err)
		}
	}
	ptrs := make([]client.Ptr, len(ws))
	for i, off := range offs {
		ptrs[i] = base + client.Ptr(off)
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
