package models

import (
	"fmt"
	"math"

	"github.com/vgpu/vgpu/api"
)

// GPTReference is the decoder's forward pass in float64, written from the
// model's mathematics and sharing nothing with the kernels, with a KV cache
// of its own: it checks what a vGPU computes.
type GPTReference struct {
	m *GPT
	// k[l][h][p], v[l][h][p]: layer l's key and value of head h at
	// position p, for the positions seen so far.
	k, v [][][][]float64
	pos  int
}

// Reference returns a reference with an empty KV cache.
func (m *GPT) Reference() *GPTReference {
	r := &GPTReference{m: m, k: make([][][][]float64, m.Config.Layers), v: make([][][][]float64, m.Config.Layers)}
	for l := range r.k {
		r.k[l] = make([][][]float64, m.Config.Heads)
		r.v[l] = make([][][]float64, m.Config.Heads)
	}
	return r
}

// Pos is the position the next token will take.
func (r *GPTReference) Pos() int { return r.pos }

// Forward runs tokens at the next positions, appends their keys and values
// to the cache, and returns the logits of the last one.
func (r *GPTReference) Forward(tokens []int32) ([]float64, error) {
	cfg := r.m.Config
	if len(tokens) == 0 || r.pos+len(tokens) > cfg.Context {
		return nil, fmt.Errorf("reference: %d tokens at position %d: the context holds %d: %w", len(tokens), r.pos, cfg.Context, api.ErrInvalidArgument)
	}
	for i, tok := range tokens {
		if tok < 0 || int(tok) >= cfg.Vocab {
			return nil, fmt.Errorf("reference: token %d is %d, the vocabulary has %d: %w", i, tok, cfg.Vocab, api.ErrInvalidArgument)
		}
	}
	var x []float64
	for i, tok := range tokens {
		x = r.token(tok, r.pos+i)
	}
	r.pos += len(tokens)
	x = layerNorm(x, r.m.w("ln_f.g"), r.m.w("ln_f.b"))
	return matVec(r.m.w(r.m.headName()), x), nil
}

// token runs one token at position p through every block, attending to
// the positions before it in the cache, and returns its residual stream.
func (r *GPTReference) token(tok int32, p int) []float64 {
	cfg := r.m.Config
	dm, hd := cfg.DModel, cfg.headDim()
	x := make([]float64, dm)
	wte, wpe := r.m.w("wte")[int(tok)*dm:], r.m.w("wpe")[p*dm:]
	for i := range x {
		x[i] = float64(wte[i]) + float64(wpe[i])
	}
	for l := range cfg.Layers {
		pre := fmt.Sprintf("h.%d.", l)
		qkv := linear(layerNorm(x, r.m.w(pre+"ln_1.g"), r.m.w(pre+"ln_1.b")), r.m.w(pre+"attn.qkv.w"), r.m.w(pre+"attn.qkv.b"))
		att := make([]float64, dm)
		for h := range cfg.Heads {
			q := qkv[h*hd : (h+1)*hd]
			r.k[l][h] = append(r.k[l][h], qkv[dm+h*hd:dm+(h+1)*hd])
			r.v[l][h] = append(r.v[l][h], qkv[2*dm+h*hd:2*dm+(h+1)*hd])
			// Softmax over the scores of positions 0 … p, max subtracted.
			scores := make([]float64, p+1)
			top := math.Inf(-1)
			for j := range scores {
				scores[j] = dot(q, r.k[l][h][j]) / math.Sqrt(float64(hd))
				top = math.Max(top, scores[j])
			}
			var sum float64
			for j := range scores {
				scores[j] = math.Exp(scores[j] - top)
				sum += scores[j]
			}
			out := att[h*hd : (h+1)*hd]
			for j, s := range scores {
				for e, ve := range r.v[l][h][j] {
					out[e] += s / sum * ve
				}
			}
		}
		proj := linear(att, r.m.w(pre+"attn.proj.w"), r.m.w(pre+"attn.proj.b"))
		for i := range x {
			x[i] += proj[i]
		}
		fc := linear(layerNorm(x, r.m.w(pre+"ln_2.g"), r.m.w(pre+"ln_2.b")), r.m.w(pre+"mlp.fc.w"), r.m.w(pre+"mlp.fc.b"))
		for i, u := range fc {
			fc[i] = 0.5 * u * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(u+0.044715*u*u*u)))
		}
		mlp := linear(fc, r.m.w(pre+"mlp.proj.w"), r.m.w(pre+"mlp.proj.b"))
		for i := range x {
			x[i] += mlp[i]
		}
	}
	return x
}

// linear is x·w + b for w of len(x) rows of len(b) (GPT-2's Conv1D).
func linear(x []float64, w, b []float32) []float64 {
	out := make([]float64, len(b))
	for j := range out {
		s := float64(b[j])
		for i, xv := range x {
			s += xv * float64(w[i*len(out)+j])
		}
		out[j] = s
	}
	return out
}

// matVec is w·x for w of len(w)/len(x) rows of len(x).
func matVec(w []float32, x []float64) []float64 {
	out := make([]float64, len(w)/len(x))
	for i := range out {
		row := w[i*len(x) : (i+1)*len(x)]
		var s float64
		for j, xv := range x {
			s += float64(row[j]) * xv
		}
		out[i] = s
	}
	return out
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// layerNorm is (x − mean) / √(variance + ε) · g + b, the variance the
// population's (divided by n).
func layerNorm(x []float64, g, b []float32) []float64 {
	var mean, sq float64
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	for _, v := range x {
		sq += (v - mean) * (v - mean)
	}
	inv := 1 / math.Sqrt(sq/float64(len(x))+layerNormEps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = (v-mean)*inv*float64(g[i]) + float64(b[i])
	}
	return out
}

// Argmax is the first index of the largest of v.
func Argmax[T float32 | float64](v []T) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
