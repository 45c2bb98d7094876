package models

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/workload"
)

// DemoTolerance bounds a device logit's difference from the float64
// reference, relative to max(1, |reference|): float32 kernels against
// float64 mathematics, over a couple of blocks.
const DemoTolerance = 1e-3

// DecoderDemo is vgpuctl demo's decoder: cfg's model loaded with hints,
// a prompt of promptLen seeded tokens prefilled as one graph invocation,
// then generated greedily to n tokens, one decode invocation each, every
// invocation's logits checked against the reference.
func DecoderDemo(cfg GPTConfig, promptLen, n int) workload.Workload {
	name := fmt.Sprintf("GPT decoder, %d layers × d_model %d, vocab %d", cfg.Layers, cfg.DModel, cfg.Vocab)
	return workload.Workload{Name: name, Run: func(c *client.Client, r *workload.Result) error {
		m, err := NewGPT(cfg)
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(promptLen)))
		prompt := make([]int32, promptLen)
		for i := range prompt {
			prompt[i] = int32(rng.IntN(cfg.Vocab))
		}
		start := time.Now()
		dev, err := m.Load(c, true)
		if err != nil {
			return err
		}
		run := dev.Runner(RunOptions{Out: OutLogits | OutNext})
		defer run.Close()
		g, err := Generate(run, m.Reference(), prompt, n, DemoTolerance)
		r.Elapsed = time.Since(start)
		// Host↔device bytes, as the mediator counts them: the weights, and
		// every invocation's inputs and outputs.
		st, serr := c.Stats()
		r.Bytes = st.CopiedIn + st.CopiedOut
		r.Work = fmt.Sprintf("prompt of %d, %d tokens generated greedily, %d passes checked (max |Δlogit| %.1e)", promptLen, len(g.Tokens), g.Passes, g.MaxDiff)
		if errors.Is(err, ErrMismatch) {
			r.Detail = err.Error()
			return serr
		}
		r.Checked = err == nil
		return errors.Join(err, serr)
	}}
}
