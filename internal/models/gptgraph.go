package models

import (
	"fmt"
	"math"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Outputs say what a decoder graph returns, of its last position.
type Outputs uint8

// Outputs of a decoder graph, in this order when both are asked for.
const (
	OutLogits Outputs = 1 << iota // the logits, f32 [vocab]
	OutNext                       // the greedy next token (argmax), i32 [1]
)

// Graph describes the decoder's forward pass over t tokens (the input
// "ids", i32 [t]) at positions pos … pos+t−1, pos being the graph's one
// scalar input: it appends their keys and values to the KV caches and
// returns out of the last position. Every operation is of phase ph.
// Prefill is Graph(prompt length, api.PhasePrefill, …) at pos 0; decode
// is Graph(1, api.PhaseDecode, …) at the position of its token.
func (d *GPTOnDevice) Graph(t int, ph api.Phase, out Outputs) (*client.GraphDef, error) {
	cfg := d.Model.Config
	if t < 1 || t > cfg.Context {
		return nil, fmt.Errorf("GPT graph of %d tokens: want 1 to the context, %d: %w", t, cfg.Context, api.ErrInvalidArgument)
	}
	if out&(OutLogits|OutNext) == 0 || out&^(OutLogits|OutNext) != 0 {
		return nil, fmt.Errorf("GPT graph outputs %#x: want logits, the next token or both: %w", uint8(out), api.ErrInvalidArgument)
	}
	b := client.NewGraphDef(fmt.Sprintf("gpt %v of %d tokens", ph, t))
	g := &gptGraph{b: b, ph: ph, dev: d, tensors: map[string]client.Tensor{}}
	pos := b.Scalar("pos")
	v, dm, ctx, h, hd := cfg.Vocab, cfg.DModel, cfg.Context, cfg.Heads, cfg.headDim()

	ids := b.Input("ids", api.DTypeI32, int64(t))
	tok := g.act("tok_emb", t, dm)
	g.op("embedding", client.Int(t), client.Int(v), client.Int(dm), ids, g.weight("wte"), tok)
	pe := g.act("pos_emb", t, dm)
	g.op("slice", client.Int(1), client.Int(ctx), client.Int(dm), pos, client.Int(t), g.weight("wpe"), pe)
	x := g.add("x", tok, pe, t, dm, t)

	for l := range cfg.Layers {
		p := fmt.Sprintf("h.%d.", l)
		qkv := g.linear(p+"attn.qkv", g.layerNorm(p+"ln_1", x, t), t, dm, 3*dm)
		// [t, 3, heads, head_dim] → [3, heads, t, head_dim], then q, k and v.
		heads := g.act(p+"attn.heads", 3, h, t, hd)
		g.op("permute", client.Int(t), client.Int(3), client.Int(h), client.Int(hd),
			client.Int(1), client.Int(2), client.Int(0), client.Int(3), qkv, heads)
		var qkvs [3]client.Tensor
		for i, name := range []string{"q", "k", "v"} {
			qkvs[i] = g.act(p+"attn."+name, h, t, hd)
			g.op("slice", client.Int(1), client.Int(3), client.Int(h*t*hd), client.Int(i), client.Int(1), heads, qkvs[i])
		}
		kc := g.b.KVCache(p+"attn.k_cache", api.DTypeF32, d.k[l], int64(h), int64(ctx), int64(hd))
		vc := g.b.KVCache(p+"attn.v_cache", api.DTypeF32, d.v[l], int64(h), int64(ctx), int64(hd))
		for i, cache := range []client.Tensor{kc, vc} {
			g.op("kv_append", client.Int(h), client.Int(ctx), client.Int(t), client.Int(hd), pos, qkvs[1+i], cache)
		}
		att := g.act(p+"attn.out", h, t, hd)
		g.op("attention", client.Int(h), client.Int(t), client.Int(hd), client.Int(ctx), pos, client.Int(1),
			client.Float(1/math.Sqrt(float64(hd))), qkvs[0], kc, vc, att)
		// [heads, t, head_dim] → [t, heads, head_dim] = [t, d_model].
		merged := g.act(p+"attn.merged", t, dm)
		g.op("permute", client.Int(1), client.Int(h), client.Int(t), client.Int(hd),
			client.Int(0), client.Int(2), client.Int(1), client.Int(3), att, merged)
		x = g.add(p+"attn.residual", x, g.linear(p+"attn.proj", merged, t, dm, dm), t, dm, t)

		fc := g.linear(p+"mlp.fc", g.layerNorm(p+"ln_2", x, t), t, dm, 4*dm)
		gelu := g.act(p+"mlp.gelu", t, 4*dm)
		g.op("gelu", client.Int(t*4*dm), client.Int(1), fc, gelu)
		x = g.add(p+"mlp.residual", x, g.linear(p+"mlp.proj", gelu, t, 4*dm, dm), t, dm, t)
	}

	xf := g.layerNorm("ln_f", x, t)
	last := g.act("last", 1, dm)
	g.op("slice", client.Int(1), client.Int(t), client.Int(dm), client.Int(t-1), client.Int(1), xf, last)
	var logits client.Tensor
	if out&OutLogits != 0 {
		logits = b.Output("logits", api.DTypeF32, int64(v))
	} else {
		logits = g.act("logits", v)
	}
	g.op("matmul", client.Int(1), client.Int(1), client.Int(v), client.Int(dm), client.Int(0), client.Int(1), client.Int(1),
		last, g.weight(d.Model.headName()), logits)
	if out&OutNext != 0 {
		g.op("argmax", client.Int(1), client.Int(v), logits, b.Output("next", api.DTypeI32, 1))
	}
	return b, nil
}

// gptGraph builds one decoder graph.
type gptGraph struct {
	b       *client.GraphDef
	ph      api.Phase
	dev     *GPTOnDevice
	tensors map[string]client.Tensor // weights declared so far, by name
}

func (g *gptGraph) op(kernel string, args ...client.GraphArg) { g.b.Op(g.ph, kernel, args...) }

func (g *gptGraph) act(name string, shape ...int) client.Tensor {
	s := make([]int64, len(shape))
	for i, n := range shape {
		s[i] = int64(n)
	}
	return g.b.Activation(name, api.DTypeF32, s...)
}

// weight declares the model's weight called name, once per graph.
func (g *gptGraph) weight(name string) client.Tensor {
	if t, ok := g.tensors[name]; ok {
		return t
	}
	w := g.dev.Model.weights[g.dev.Model.index[name]]
	t := g.b.Weight(name, api.DTypeF32, g.dev.weights[name], w.Shape...)
	g.tensors[name] = t
	return t
}

// add is a + b over rows × cols, b broadcast over rows when bRows is 1.
func (g *gptGraph) add(name string, a, b client.Tensor, rows, cols, bRows int) client.Tensor {
	out := g.act(name, rows, cols)
	g.op("add", client.Int(rows), client.Int(cols), client.Int(bRows), a, b, out)
	return out
}

// linear is x·W + b for x of rows × in and the weights name.w [in, out],
// name.b [out].
func (g *gptGraph) linear(name string, x client.Tensor, rows, in, out int) client.Tensor {
	y := g.act(name+".mm", rows, out)
	g.op("matmul", client.Int(1), client.Int(rows), client.Int(out), client.Int(in), client.Int(0), client.Int(0), client.Int(1),
		x, g.weight(name+".w"), y)
	return g.add(name, y, g.weight(name+".b"), rows, out, 1)
}

// layerNorm normalises each of rows rows of x with the weights name.g and
// name.b.
func (g *gptGraph) layerNorm(name string, x client.Tensor, rows int) client.Tensor {
	dm := g.dev.Model.Config.DModel
	out := g.act(name, rows, dm)
	g.op("layer_norm", client.Int(rows), client.Int(dm), client.Float(layerNormEps), x, g.weight(name+".g"), g.weight(name+".b"), out)
	return out
}
