package mediator

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

func catalogMap() map[string]api.KernelInfo {
	m := map[string]api.KernelInfo{}
	for _, k := range kernels.Catalog() {
		m[k.Name] = k
	}
	return m
}

func tensor(t uint32) api.OpArg { return api.OpArg{Kind: api.OpArgTensor, Tensor: t} }
func i64(v int64) api.OpArg     { return api.OpArg{Kind: api.OpArgI64, I64: v} }
func f32(v float32) api.OpArg   { return api.OpArg{Kind: api.OpArgF32, F32: v} }

// fill and add are ops of the layout's graphs: x = v, and y += x.
func fill(x uint32, n int64) api.OpDef {
	return api.OpDef{Kernel: "fill_f32", Args: []api.OpArg{tensor(x), i64(n), f32(1)}}
}

func add(x, y uint32, n int64) api.OpDef {
	return api.OpDef{Kernel: "saxpy", Args: []api.OpArg{i64(n), f32(1), tensor(x), tensor(y)}}
}

// TestArenaReusesBytesOfDeadTensors lays out a chain in → a → b → out,
// where a is dead by the time out is written, so they share bytes.
func TestArenaReusesBytesOfDeadTensors(t *testing.T) {
	g := &api.GraphDef{
		Tensors: []api.TensorDef{
			{Name: "in", DType: api.DTypeF32, Shape: []int64{100}, Residency: api.ResInput},
			{Name: "a", DType: api.DTypeF32, Shape: []int64{100}, Residency: api.ResActivation},
			{Name: "b", DType: api.DTypeF32, Shape: []int64{100}, Residency: api.ResActivation},
			{Name: "out", DType: api.DTypeF32, Shape: []int64{100}, Residency: api.ResOutput},
			{Name: "unused", DType: api.DTypeF32, Shape: []int64{1 << 20}, Residency: api.ResActivation},
		},
		Ops: []api.OpDef{fill(1, 100), add(0, 1, 100), fill(2, 100), add(1, 2, 100), fill(3, 100), add(2, 3, 100)},
	}
	c, err := api.CheckGraph(g, catalogMap())
	if err != nil {
		t.Fatal(err)
	}
	off, size := layArena(g, c)
	// in lives until op 1, a from 0 to 3, b from 2 to 5, out from 4 on:
	// in and b may share, a and out may share; two slots of 512 bytes.
	if size != 512+400 {
		t.Fatalf("arena of %d bytes, offsets %v; want 912", size, off)
	}
	if off[0] != off[2] || off[1] != off[3] || off[0] == off[1] {
		t.Fatalf("offsets %v: want in and b together, a and out together", off)
	}
}

// TestArenaLayoutProperty checks random graphs' arenas: every tensor
// placed aligned and inside the arena, no two that live at once sharing
// a byte, and the arena no larger than all of them side by side.
func TestArenaLayoutProperty(t *testing.T) {
	catalog := catalogMap()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "tensors")
		g := &api.GraphDef{Tensors: make([]api.TensorDef, n)}
		sizes := make([]int64, n)
		for i := range g.Tensors {
			sizes[i] = rapid.Int64Range(1, 300).Draw(t, "elems")
			res := rapid.SampledFrom([]api.Residency{api.ResInput, api.ResActivation, api.ResOutput}).Draw(t, "residency")
			g.Tensors[i] = api.TensorDef{DType: api.DTypeF32, Shape: []int64{sizes[i]}, Residency: res}
		}
		written := make([]bool, n)
		for range rapid.IntRange(0, 12).Draw(t, "ops") {
			y := rapid.IntRange(0, n-1).Draw(t, "y")
			if !written[y] && g.Tensors[y].Residency != api.ResInput {
				g.Ops = append(g.Ops, fill(uint32(y), sizes[y]))
				written[y] = true
				continue
			}
			var same []int // tensors of y's size that may be read
			for x := range n {
				if sizes[x] == sizes[y] && (written[x] || g.Tensors[x].Residency == api.ResInput) {
					same = append(same, x)
				}
			}
			x := rapid.SampledFrom(same).Draw(t, "x")
			g.Ops = append(g.Ops, add(uint32(x), uint32(y), sizes[y]))
		}
		for i := range g.Tensors {
			if g.Tensors[i].Residency == api.ResOutput && !written[i] {
				g.Tensors[i].Residency = api.ResActivation
			}
		}
		c, err := api.CheckGraph(g, catalog)
		if err != nil {
			t.Fatal(err)
		}
		off, size := layArena(g, c)
		live := func(i int) (int, int, bool) {
			switch g.Tensors[i].Residency {
			case api.ResInput:
				return -1, c.Last[i], true
			case api.ResOutput:
				return c.First[i], len(g.Ops), true
			}
			return c.First[i], c.Last[i], c.First[i] >= 0
		}
		var sum uint64
		for i := range n {
			from, to, ok := live(i)
			if !ok {
				continue
			}
			sum += alignArena(c.Bytes[i])
			if off[i]%arenaAlign != 0 || off[i]+c.Bytes[i] > size {
				t.Fatalf("tensor %d at %d (+%d) in an arena of %d", i, off[i], c.Bytes[i], size)
			}
			for j := range i {
				f, e, ok := live(j)
				if ok && from <= e && f <= to && off[i] < off[j]+c.Bytes[j] && off[j] < off[i]+c.Bytes[i] {
					t.Fatalf("tensors %d [%d, %d] and %d [%d, %d] live together and share bytes: %d+%d, %d+%d",
						i, from, to, j, f, e, off[i], c.Bytes[i], off[j], c.Bytes[j])
				}
			}
		}
		if size > sum {
			t.Fatalf("arena of %d bytes, more than its tensors side by side (%d)", size, sum)
		}
	})
}
