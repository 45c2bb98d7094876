package models

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/workload"
)

// A DLRM-style inference step: a batch of bags of embedding-table rows is
// pooled (embedding_bag_sum), then goes through two dense layers (sgemm on
// a stream, matmul in a graph: the same sums in the same order). The outputs are computed on the host by the references of
// internal/workload, which follow the kernels' documented order of
// operations, so a device's outputs must match bit for bit.

// DLRMShape sizes the model and a benchmark's run of it; zero fields take
// the defaults (Defaults).
type DLRMShape struct {
	TableBytes int `json:"table_bytes"` // embedding table; default 64 MiB (at most the run's largest size)
	Dim        int `json:"dim"`         // embedding width; default 64
	Batch      int `json:"batch"`       // bags per step; default 128
	Pooling    int `json:"pooling"`     // rows per bag; default 32
	Hidden     int `json:"hidden"`      // first layer's outputs; default 256
	Out        int `json:"out"`         // second layer's outputs; default 64
	Steps      int `json:"steps"`       // steps per tenant of a benchmark; default 32
}

// Defaults fills the zero fields, the table at most maxBytes, and rounds
// the table down to whole rows (at least one).
func (sh *DLRMShape) Defaults(maxBytes int) {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&sh.TableBytes, min(64<<20, maxBytes))
	def(&sh.Dim, 64)
	def(&sh.Batch, 128)
	def(&sh.Pooling, 32)
	def(&sh.Hidden, 256)
	def(&sh.Out, 64)
	def(&sh.Steps, 32)
	sh.TableBytes = max(1, sh.TableBytes/(4*sh.Dim)) * 4 * sh.Dim // whole rows
}

// dlrmBatches is how many different batches a model has; its users cycle
// through them.
const dlrmBatches = 4

// DLRMBatch is one step's inputs and its outputs computed on the host.
type DLRMBatch struct {
	Indices, Offsets []int32
	Want             []float32 // Batch × Out
}

// DLRM is the model's weights and a few batches.
type DLRM struct {
	DLRMShape
	Rows          int
	Table, W1, W2 []float32 // Rows × Dim, Dim × Hidden, Hidden × Out
	Batches       []DLRMBatch
}

// NewDLRM draws a model of shape sh (with Defaults applied) from seed:
// table entries uniform in [-1, 1), layers scaled by 1/√fan_in, which
// keeps a layer's outputs of the order of its inputs; bags of Pooling rows
// drawn uniformly.
func NewDLRM(sh DLRMShape, seed uint64) *DLRM {
	rng := rand.New(rand.NewPCG(seed, 0x646c726d))
	m := &DLRM{DLRMShape: sh, Rows: sh.TableBytes / (4 * sh.Dim)}
	m.Table = workload.RandFloats(rng, m.Rows*sh.Dim)
	m.W1 = scaled(workload.RandFloats(rng, sh.Dim*sh.Hidden), sh.Dim)
	m.W2 = scaled(workload.RandFloats(rng, sh.Hidden*sh.Out), sh.Hidden)
	for range dlrmBatches {
		b := DLRMBatch{Indices: make([]int32, sh.Batch*sh.Pooling), Offsets: make([]int32, sh.Batch)}
		for i := range b.Offsets {
			b.Offsets[i] = int32(i * sh.Pooling)
		}
		for i := range b.Indices {
			b.Indices[i] = int32(rng.IntN(m.Rows))
		}
		emb := workload.EmbeddingBagSumRef(m.Table, sh.Dim, b.Indices, b.Offsets)
		hid := make([]float32, sh.Batch*sh.Hidden)
		workload.SgemmRef(sh.Batch, sh.Hidden, sh.Dim, 1, emb, m.W1, 0, hid)
		b.Want = make([]float32, sh.Batch*sh.Out)
		workload.SgemmRef(sh.Batch, sh.Out, sh.Hidden, 1, hid, m.W2, 0, b.Want)
		m.Batches = append(m.Batches, b)
	}
	return m
}

// scaled divides v by √fanIn.
func scaled(v []float32, fanIn int) []float32 {
	f := float32(1 / math.Sqrt(float64(fanIn)))
	for i := range v {
		v[i] *= f
	}
	return v
}

// Weights lists the model's weights: the table and the two layers.
func (m *DLRM) Weights() []Weight {
	return []Weight{
		{"table", []int64{int64(m.Rows), int64(m.Dim)}, m.Table},
		{"w1", []int64{int64(m.Dim), int64(m.Hidden)}, m.W1},
		{"w2", []int64{int64(m.Hidden), int64(m.Out)}, m.W2},
	}
}

// Graph describes the step as a graph of phase forward, over the sealed
// weights at table, w1 and w2 (Upload with hints): inputs "indices"
// (i32 [Batch·Pooling]) and "offsets" (i32 [Batch]), output "out"
// (f32 [Batch, Out]).
func (m *DLRM) Graph(table, w1, w2 client.Ptr) *client.GraphDef {
	b := client.NewGraphDef("dlrm step")
	n, bags := m.Batch*m.Pooling, m.Batch
	idx := b.Input("indices", api.DTypeI32, int64(n))
	off := b.Input("offsets", api.DTypeI32, int64(bags))
	emb := b.Activation("pooled", api.DTypeF32, int64(bags), int64(m.Dim))
	hid := b.Activation("hidden", api.DTypeF32, int64(bags), int64(m.Hidden))
	out := b.Output("out", api.DTypeF32, int64(bags), int64(m.Out))
	ws := m.Weights()
	t := b.Weight(ws[0].Name, api.DTypeF32, table, ws[0].Shape...)
	l1 := b.Weight(ws[1].Name, api.DTypeF32, w1, ws[1].Shape...)
	l2 := b.Weight(ws[2].Name, api.DTypeF32, w2, ws[2].Shape...)
	b.Op(api.PhaseForward, "embedding_bag_sum", t, client.Int(m.Rows), client.Int(m.Dim), idx, client.Int(n), off, client.Int(bags), emb)
	// matmul, not sgemm: sgemm's c is read as well as written (beta·C),
	// which a graph refuses for an activation no earlier op wrote. Both
	// sum in p order from 0 in float32, so the outputs are the same.
	layer := func(x client.Tensor, k, n int, w, y client.Tensor) {
		b.Op(api.PhaseForward, "matmul", client.Int(1), client.Int(bags), client.Int(n), client.Int(k),
			client.Int(0), client.Int(0), client.Int(1), x, w, y)
	}
	layer(emb, m.Dim, m.Hidden, l1, hid)
	layer(hid, m.Hidden, m.Out, l2, out)
	return b
}

// Check compares a step's outputs with batch k's, bit for bit: the kernels
// promise their order of operations and rounding, which the reference
// follows.
func (m *DLRM) Check(k int, out []byte) error {
	if err := workload.CloseEnough(client.BytesFloat32(out), m.Batches[k].Want, 0); err != nil {
		return fmt.Errorf("batch %d: output %v: %w", k, err, ErrMismatch)
	}
	return nil
}
