package models

import (
	"errors"
	"fmt"
	"math"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// ErrMismatch is what a check against a reference wraps when the device's
// result differs from it.
var ErrMismatch = errors.New("result differs from the reference")

// RunOptions say how a GPTRunner drives the decoder.
type RunOptions struct {
	// OpByOp runs each pass as stream launches (OpByOp) instead of a
	// registered graph.
	OpByOp bool
	// NoPhases registers the graphs with api.PhaseOther instead of
	// prefill (several tokens) and decode (one): the same work, its
	// meaning withheld from the node's scheduler.
	NoPhases bool
	Out      Outputs
}

// invoker runs a GraphDef one way or the other.
type invoker interface {
	Invoke(scalars []int64, inputs ...[]byte) ([][]byte, error)
	Release() error
}

// GPTRunner runs forward passes of a loaded decoder, one graph (or one
// OpByOp) per token count, made on first use or by Prepare.
type GPTRunner struct {
	dev *GPTOnDevice
	opt RunOptions
	by  map[int]invoker
}

// Runner returns a runner of d; nothing is registered yet.
func (d *GPTOnDevice) Runner(o RunOptions) *GPTRunner {
	return &GPTRunner{dev: d, opt: o, by: map[int]invoker{}}
}

// Prepare registers (or allocates) the passes of each token count in ts now,
// so that the first Forward of each does not.
func (r *GPTRunner) Prepare(ts ...int) error {
	for _, t := range ts {
		if _, err := r.get(t); err != nil {
			return err
		}
	}
	return nil
}

func (r *GPTRunner) get(t int) (invoker, error) {
	if inv, ok := r.by[t]; ok {
		return inv, nil
	}
	ph := api.PhasePrefill
	switch {
	case r.opt.NoPhases:
		ph = api.PhaseOther
	case t == 1:
		ph = api.PhaseDecode
	}
	b, err := r.dev.Graph(t, ph, r.opt.Out)
	if err != nil {
		return nil, err
	}
	var inv invoker
	if r.opt.OpByOp {
		inv, err = NewOpByOp(r.dev.c, b)
	} else {
		inv, err = r.dev.c.RegisterGraph(b)
	}
	if err != nil {
		return nil, err
	}
	r.by[t] = inv
	return inv, nil
}

// Step is what a forward pass returns of its last position.
type Step struct {
	Logits []float32 // with OutLogits
	Next   int32     // with OutNext
}

// Forward runs tokens at positions pos, pos+1, … (appending to the KV
// caches) and returns what the runner's Outputs ask for of the last.
func (r *GPTRunner) Forward(pos int, tokens []int32) (Step, error) {
	inv, err := r.get(len(tokens))
	if err != nil {
		return Step{}, err
	}
	outs, err := inv.Invoke([]int64{int64(pos)}, client.Int32Bytes(tokens))
	if err != nil {
		return Step{}, err
	}
	var st Step
	if r.opt.Out&OutLogits != 0 {
		st.Logits, outs = client.BytesFloat32(outs[0]), outs[1:]
	}
	if r.opt.Out&OutNext != 0 {
		st.Next = client.BytesInt32(outs[0])[0]
	}
	return st, nil
}

// Close releases the runner's graphs (or frees its buffers).
func (r *GPTRunner) Close() error {
	var errs []error
	for t, inv := range r.by {
		errs = append(errs, inv.Release())
		delete(r.by, t)
	}
	return errors.Join(errs...)
}

// Generation is what Generate did.
type Generation struct {
	Tokens  []int32 // generated, after the prompt
	MaxDiff float64 // the largest |device − reference| of a logit, over every pass
	Passes  int     // forward passes run and checked: the prefill and each decode step
}

// Generate runs prompt as one pass at position 0, then n−1 decode passes of
// one token each, feeding every pass the token the previous one chose,
// and checks every pass against ref (which must be fresh): each logit,
// when the runner returns them, within tol·max(1, |reference|) of the
// reference's, and each chosen token one whose reference logit is within
// tol of the reference's largest (the greedy choice, up to ties closer
// than the tolerance). A difference wraps ErrMismatch and names the pass
// and the value. It returns the n generated tokens.
func Generate(r *GPTRunner, ref *GPTReference, prompt []int32, n int, tol float64) (Generation, error) {
	var g Generation
	if n < 1 || len(prompt) == 0 || len(prompt)+n-1 > r.dev.Model.Config.Context {
		return g, fmt.Errorf("generate %d tokens after a prompt of %d: the context holds %d: %w",
			n, len(prompt), r.dev.Model.Config.Context, api.ErrInvalidArgument)
	}
	in, pos := prompt, 0
	for range n {
		st, err := r.Forward(pos, in)
		if err != nil {
			return g, fmt.Errorf("pass %d at position %d: %w", g.Passes, pos, err)
		}
		want, err := ref.Forward(in)
		if err != nil {
			return g, err
		}
		next, diff, err := CheckStep(st, want, r.opt.Out, tol)
		g.MaxDiff = max(g.MaxDiff, diff)
		if err != nil {
			return g, fmt.Errorf("pass %d at position %d: %w", g.Passes, pos, err)
		}
		g.Passes++
		g.Tokens = append(g.Tokens, next)
		pos += len(in)
		in = []int32{next}
	}
	return g, nil
}

// CheckStep checks a pass's result, of a runner of Outputs out, against
// the reference's logits as Generate does, and returns the token it chose
// (by the device's argmax, or by its logits' when it returns no token) and
// the largest difference of a logit.
func CheckStep(st Step, want []float64, out Outputs, tol float64) (int32, float64, error) {
	var diff float64
	if out&OutLogits != 0 {
		if len(st.Logits) != len(want) {
			return 0, 0, fmt.Errorf("%d logits, want %d: %w", len(st.Logits), len(want), ErrMismatch)
		}
		for i, g := range st.Logits {
			d := math.Abs(float64(g) - want[i])
			if math.IsNaN(d) || d > tol*math.Max(1, math.Abs(want[i])) {
				return 0, d, fmt.Errorf("logit %d is %g, reference %g: %w", i, g, want[i], ErrMismatch)
			}
			diff = max(diff, d)
		}
	}
	// The device's choice, or without one, its logits'.
	next := st.Next
	if out&OutNext == 0 {
		next = int32(Argmax(st.Logits))
	}
	if next < 0 || int(next) >= len(want) {
		return 0, diff, fmt.Errorf("next token %d is outside the vocabulary of %d: %w", next, len(want), ErrMismatch)
	}
	if best := want[Argmax(want)]; want[next] < best-tol {
		return 0, diff, fmt.Errorf("next token %d (reference logit %g), the reference's %d (%g): %w", next, want[next], Argmax(want), best, ErrMismatch)
	}
	return next, diff, nil
}
