package models

import (
	"fmt"
	"testing"

	"github.com/vgpu/vgpu/internal/systest"
	"github.com/vgpu/vgpu/memory"
)

// Eight tenants loading the same model, as replicas of an inference
// service start, send its weights to the node once with hints, through the
// real deduplication of a node and a mediator: Upload packs the model's
// many tensors into one sealed allocation of whole frames, zeros after
// them, so every frame of every later tenant is named by its hash, the
// last one too, and the first tenant's zeros travel as fills. Without
// hints every tenant sends them all. Each tenant then runs a pass that
// the reference checks: what was not sent is there.
func TestEightTenantsSendAModelOnce(t *testing.T) {
	// 3.7 MiB in 28 tensors: a whole frame and a partial one.
	cfg := GPTConfig{Vocab: 6000, DModel: 128, Heads: 2, Layers: 1, Context: 16, TiedHead: true, Seed: 11}
	const tenants = 8
	socket := systest.Start(t, 1, 256<<20)
	for _, hints := range []bool{false, true} {
		cfg.Seed++ // weights no earlier load left on the node
		m, err := NewGPT(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var weights uint64
		for _, w := range m.Weights() {
			weights += uint64(4 * len(w.Data))
		}
		frames := (weights + memory.FrameSize - 1) / memory.FrameSize
		var sent, deduped uint64
		devs := make([]*GPTOnDevice, tenants)
		for i := range devs {
			c := dial(t, socket, fmt.Sprintf("replica-%d", i))
			if devs[i], err = m.Load(c, hints); err != nil {
				t.Fatal(err)
			}
			st, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			sent += st.NetOut
			deduped += st.DedupBytes
		}
		// Beside the weights, each tenant's requests: allocations, the
		// copy's, the hashes of its frames, the seal.
		const slack = tenants * 1024
		switch {
		case hints && (sent < weights || sent > weights+slack || deduped != (tenants-1)*frames*memory.FrameSize):
			t.Errorf("with hints, %d tenants sent %d bytes (%.3f copies of %d), %d not sent", tenants, sent, float64(sent)/float64(weights), weights, deduped)
		case !hints && (sent < tenants*weights || sent > tenants*weights+slack || deduped != 0):
			t.Errorf("without hints, %d tenants sent %d bytes (%.3f copies of %d), %d not sent", tenants, sent, float64(sent)/float64(weights), weights, deduped)
		}
		t.Logf("hints %v: %.4f copies of the weights sent", hints, float64(sent)/float64(weights))
		want, err := m.Reference().Forward([]int32{5, 1})
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range devs {
			r := d.Runner(RunOptions{OpByOp: !hints, Out: OutLogits})
			st, err := r.Forward(0, []int32{5, 1})
			if err == nil {
				_, _, err = CheckStep(st, want, OutLogits, DemoTolerance)
			}
			if err != nil {
				t.Fatalf("hints %v, tenant %d: %v", hints, i, err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
