package models

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
)

// tinyGPT is small enough for the race detector.
var tinyGPT = GPTConfig{Vocab: 37, DModel: 16, Heads: 2, Layers: 2, Context: 12, Seed: 7}

func TestGPTConfigCheckNamesTheField(t *testing.T) {
	for _, c := range []struct {
		mod  func(*GPTConfig)
		want string
	}{
		{func(c *GPTConfig) { c.Vocab = 0 }, "vocab 0"},
		{func(c *GPTConfig) { c.DModel = -4 }, "d_model -4"},
		{func(c *GPTConfig) { c.Heads = 3 }, "heads 3"},
		{func(c *GPTConfig) { c.Layers = 0 }, "layers 0"},
		{func(c *GPTConfig) { c.Context = 1 << 21 }, "context 2097152"},
		{func(c *GPTConfig) { c.DModel, c.Layers = 1<<14, 4 }, "parameters"},
	} {
		cfg := tinyGPT
		c.mod(&cfg)
		_, err := NewGPT(cfg)
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want one naming %q", cfg, err, c.want)
		}
	}
}

func TestGPTWeightsAreAFunctionOfTheConfig(t *testing.T) {
	for _, tied := range []bool{true, false} {
		cfg := tinyGPT
		cfg.TiedHead = tied
		a, err := NewGPT(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := NewGPT(cfg)
		var n int64
		for i, w := range a.Weights() {
			n += int64(len(w.Data))
			if !slices.Equal(w.Data, b.Weights()[i].Data) {
				t.Fatalf("weight %s differs between two builds of one config", w.Name)
			}
			elems := int64(1)
			for _, d := range w.Shape {
				elems *= d
			}
			if elems != int64(len(w.Data)) {
				t.Errorf("weight %s: shape %v, %d values", w.Name, w.Shape, len(w.Data))
			}
		}
		if n != cfg.Params() {
			t.Errorf("tied %v: %d weights, Params says %d", tied, n, cfg.Params())
		}
		cfg.Seed++
		c, _ := NewGPT(cfg)
		if slices.Equal(a.Weights()[0].Data, c.Weights()[0].Data) {
			t.Error("another seed drew the same embedding")
		}
	}
}

func TestLayerNormAndProducts(t *testing.T) {
	got := layerNorm([]float64{1, 2, 3}, []float32{1, 2, 1}, []float32{0, 0, 0.5})
	s := 1 / math.Sqrt(2.0/3+layerNormEps)
	for i, want := range []float64{-s, 0, s + 0.5} {
		if math.Abs(got[i]-want) > 1e-12 {
			t.Errorf("layerNorm[%d] = %v, want %v", i, got[i], want)
		}
	}
	if got := matVec([]float32{1, 2, 3, 4, 5, 6}, []float64{1, -1}); !slices.Equal(got, []float64{-1, -1, -1}) {
		t.Errorf("matVec = %v", got)
	}
	// [1 -1] · [[1 2 3] [4 5 6]] + [10 20 30]
	if got := linear([]float64{1, -1}, []float32{1, 2, 3, 4, 5, 6}, []float32{10, 20, 30}); !slices.Equal(got, []float64{7, 17, 27}) {
		t.Errorf("linear = %v", got)
	}
}

// wholeSequence is the decoder written a second way: every position of
// the sequence at once, causal attention from the full key and value
// matrices, no cache. It returns the last position's logits.
func wholeSequence(m *GPT, tokens []int32) []float64 {
	cfg := m.Config
	dm, hd, n := cfg.DModel, cfg.headDim(), len(tokens)
	x := make([][]float64, n)
	for p, tok := range tokens {
		x[p] = make([]float64, dm)
		for i := range dm {
			x[p][i] = float64(m.w("wte")[int(tok)*dm+i]) + float64(m.w("wpe")[p*dm+i])
		}
	}
	for l := range cfg.Layers {
		pre := fmt.Sprintf("h.%d.", l)
		qkv := make([][]float64, n)
		for p := range x {
			qkv[p] = linear(layerNorm(x[p], m.w(pre+"ln_1.g"), m.w(pre+"ln_1.b")), m.w(pre+"attn.qkv.w"), m.w(pre+"attn.qkv.b"))
		}
		for p := range x {
			att := make([]float64, dm)
			for h := range cfg.Heads {
				w := make([]float64, p+1)
				var sum float64
				for j := range w {
					w[j] = math.Exp(dot(qkv[p][h*hd:(h+1)*hd], qkv[j][dm+h*hd:dm+(h+1)*hd]) / math.Sqrt(float64(hd)))
					sum += w[j]
				}
				for j := range w {
					for e := range hd {
						att[h*hd+e] += w[j] / sum * qkv[j][2*dm+h*hd+e]
					}
				}
			}
			proj := linear(att, m.w(pre+"attn.proj.w"), m.w(pre+"attn.proj.b"))
			for i := range dm {
				x[p][i] += proj[i]
			}
		}
		for p := range x {
			h := linear(layerNorm(x[p], m.w(pre+"ln_2.g"), m.w(pre+"ln_2.b")), m.w(pre+"mlp.fc.w"), m.w(pre+"mlp.fc.b"))
			for i, u := range h {
				h[i] = u * 0.5 * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(u+0.044715*math.Pow(u, 3))))
			}
			out := linear(h, m.w(pre+"mlp.proj.w"), m.w(pre+"mlp.proj.b"))
			for i := range dm {
				x[p][i] += out[i]
			}
		}
	}
	return matVec(m.w(m.headName()), layerNorm(x[n-1], m.w("ln_f.g"), m.w("ln_f.b")))
}

// The cached reference, fed a sequence in any split into passes, gives
// the last position's logits of the whole sequence computed without a
// cache.
func TestReferenceCacheMatchesWholeSequence(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := tinyGPT
		cfg.TiedHead = rapid.Bool().Draw(rt, "tied")
		cfg.Seed = rapid.Uint64().Draw(rt, "seed")
		m, err := NewGPT(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		tokens := rapid.SliceOfN(rapid.Int32Range(0, int32(cfg.Vocab-1)), 1, cfg.Context).Draw(rt, "tokens")
		want := wholeSequence(m, tokens)
		ref := m.Reference()
		var got []float64
		for rest := tokens; len(rest) > 0; {
			k := rapid.IntRange(1, len(rest)).Draw(rt, "pass")
			if got, err = ref.Forward(rest[:k]); err != nil {
				rt.Fatal(err)
			}
			rest = rest[k:]
		}
		if ref.Pos() != len(tokens) {
			rt.Fatalf("position %d after %d tokens", ref.Pos(), len(tokens))
		}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-9*math.Max(1, math.Abs(want[i])) {
				rt.Fatalf("logit %d: cached %v, whole sequence %v", i, got[i], want[i])
			}
		}
	})
}

func TestReferenceRefusesBadTokens(t *testing.T) {
	m, err := NewGPT(tinyGPT)
	if err != nil {
		t.Fatal(err)
	}
	ref := m.Reference()
	for _, c := range []struct {
		tokens []int32
		want   string
	}{
		{[]int32{1, 37}, "token 1 is 37"},
		{[]int32{-1}, "token 0 is -1"},
		{nil, "0 tokens"},
		{make([]int32, 13), "13 tokens at position 0"},
	} {
		if _, err := ref.Forward(c.tokens); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Forward(%v): err %v, want one naming %q", c.tokens, err, c.want)
		}
	}
	if ref.Pos() != 0 {
		t.Errorf("refused passes moved the position to %d", ref.Pos())
	}
}
