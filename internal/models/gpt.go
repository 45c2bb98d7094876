package models

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A GPT-style decoder: token embedding plus a learned positional
// embedding, Layers blocks of
//
//	x += proj(attention(split_heads(layer_norm(x)·W_qkvᵀ + b_qkv)))
//	x += mlp(layer_norm(x)),  mlp(h) = gelu_tanh(h·W_fcᵀ + b_fc)·W_projᵀ + b_proj
//
// with causal self-attention over a KV cache, a final layer_norm, and an
// LM head (the token embedding, tied, or a matrix of its own, [vocab,
// d_model] either way, so multiplied by its transpose: matmul trans_b)
// applied to the last position. Linear weights are stored as GPT-2 stores
// them (its Conv1D), [in, out]: matmul without transposes, whose kernel
// streams rows of the weight, which a decode step's single row of
// activations multiplies faster than it takes dot products of columns.

// GPTConfig sizes a decoder; its weights are a function of it.
type GPTConfig struct {
	Vocab   int `json:"vocab"`
	DModel  int `json:"d_model"`
	Heads   int `json:"heads"`
	Layers  int `json:"layers"`
	Context int `json:"context"` // positions: the KV caches' capacity
	// TiedHead makes the LM head the token embedding (as GPT-2 does);
	// otherwise it is a weight of its own.
	TiedHead bool   `json:"tied_head"`
	Seed     uint64 `json:"seed"`
}

// SmallGPT runs fast on a CPU node: about 0.5 M parameters.
var SmallGPT = GPTConfig{Vocab: 512, DModel: 128, Heads: 4, Layers: 2, Context: 128, TiedHead: true, Seed: 1}

// layerNormEps is every layer_norm's epsilon.
const layerNormEps = 1e-5

// maxGPTParams bounds a configuration's weights (a check, not a design
// limit): 1 G parameters would not fit a sim node's default memory.
const maxGPTParams = 1 << 28

// Check says what is wrong with c, naming the field.
func (c GPTConfig) Check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab", c.Vocab}, {"d_model", c.DModel}, {"heads", c.Heads}, {"layers", c.Layers}, {"context", c.Context}} {
		if f.v < 1 || f.v > 1<<20 {
			return fmt.Errorf("GPT %s %d: want 1 to %d: %w", f.name, f.v, 1<<20, api.ErrInvalidArgument)
		}
	}
	if c.DModel%c.Heads != 0 {
		return fmt.Errorf("GPT d_model %d is not a multiple of heads %d: %w", c.DModel, c.Heads, api.ErrInvalidArgument)
	}
	if n := c.Params(); n > maxGPTParams {
		return fmt.Errorf("GPT of %d parameters: at most %d: %w", n, maxGPTParams, api.ErrInvalidArgument)
	}
	return nil
}

// Params is the number of weights of a valid configuration.
func (c GPTConfig) Params() int64 {
	v, d, ctx, l := int64(c.Vocab), int64(c.DModel), int64(c.Context), int64(c.Layers)
	n := v*d + ctx*d + l*(12*d*d+13*d) + 2*d
	if !c.TiedHead {
		n += v * d
	}
	return n
}

func (c GPTConfig) headDim() int { return c.DModel / c.Heads }

// GPT is a decoder's weights.
type GPT struct {
	Config  GPTConfig
	weights []Weight
	index   map[string]int
}

// NewGPT draws the weights of cfg from its seed: embeddings uniform in
// [-1, 1), linear weights in ±1/√fan_in, biases in ±0.1, layer_norm gains
// in 1 ± 0.1 and shifts in ±0.1.
func NewGPT(cfg GPTConfig) (*GPT, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x677074))
	v, d, ctx := cfg.Vocab, cfg.DModel, cfg.Context
	m := &GPT{Config: cfg, index: map[string]int{}}
	add := func(name string, data []float32, shape ...int64) {
		m.index[name] = len(m.weights)
		m.weights = append(m.weights, Weight{Name: name, Shape: shape, Data: data})
	}
	linear := func(name string, out, in int) {
		add(name+".w", uniform(rng, in*out, 1/math.Sqrt(float64(in))), int64(in), int64(out))
		add(name+".b", uniform(rng, out, 0.1), int64(out))
	}
	norm := func(name string) {
		add(name+".g", around(rng, d, 1, 0.1), int64(d))
		add(name+".b", uniform(rng, d, 0.1), int64(d))
	}
	add("wte", uniform(rng, v*d, 1), int64(v), int64(d))
	add("wpe", uniform(rng, ctx*d, 1), int64(ctx), int64(d))
	for l := range cfg.Layers {
		p := fmt.Sprintf("h.%d.", l)
		norm(p + "ln_1")
		linear(p+"attn.qkv", 3*d, d)
		linear(p+"attn.proj", d, d)
		norm(p + "ln_2")
		linear(p+"mlp.fc", 4*d, d)
		linear(p+"mlp.proj", d, 4*d)
	}
	norm("ln_f")
	if !cfg.TiedHead {
		add("lm_head", uniform(rng, v*d, 1/math.Sqrt(float64(d))), int64(v), int64(d))
	}
	return m, nil
}

// Weights lists the model's weight tensors, in a fixed order. They are
// the model's: not to be modified.
func (m *GPT) Weights() []Weight { return m.weights }

func (m *GPT) w(name string) []float32 { return m.weights[m.index[name]].Data }

// headName is the LM head's weight.
func (m *GPT) headName() string {
	if m.Config.TiedHead {
		return "wte"
	}
	return "lm_head"
}

// GPTOnDevice is a decoder loaded into a session: its weights, and a K and
// a V cache per layer, [heads, context, head_dim] each, which the
// session's graphs of the model share.
type GPTOnDevice struct {
	Model   *GPT
	c       *client.Client
	weights map[string]client.Ptr
	k, v    []client.Ptr
}

// Load uploads m's weights to c (see Upload for hints) and allocates its KV
// caches, with hints placed next to the weights (api.HintKVCache).
func (m *GPT) Load(c *client.Client, hints bool) (*GPTOnDevice, error) {
	ptrs, err := Upload(c, m.weights, hints)
	if err != nil {
		return nil, err
	}
	d := &GPTOnDevice{Model: m, c: c, weights: make(map[string]client.Ptr, len(ptrs))}
	for i, w := range m.weights {
		d.weights[w.Name] = ptrs[i]
	}
	var o client.AllocOptions
	if hints {
		o = client.AllocOptions{Hint: api.HintKVCache, Near: ptrs[0]}
	}
	caches := make([]client.Ptr, 2*m.Config.Layers)
	for i := range caches {
		if caches[i], err = c.MallocWith(0, uint64(4*m.Config.Context*m.Config.DModel), o); err != nil {
			return nil, fmt.Errorf("KV cache: %w", err)
		}
	}
	d.k, d.v = caches[:m.Config.Layers], caches[m.Config.Layers:]
	return d, nil
}
