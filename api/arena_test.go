package api

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/vgpu/vgpu/api/wire"
)

// A LaunchArena decodes every launch as the generated Unmarshal does — the
// same message, or the same error — across a batch whose launches repeat
// and change kernel names, have no arguments, or more extents than a block
// holds, and no two decoded launches share an element.
func TestLaunchArenaDecodesAsUnmarshal(t *testing.T) {
	var nodes []NodeLaunch
	var tenants []Launch
	for i := range 300 {
		kernel := "fill_f32"
		if i%7 == 3 {
			kernel = fmt.Sprintf("k%d", i)
		}
		args, targs := []NodeArg{}, []Arg{} // decoded lists are empty, not nil
		for j := range i % 5 {
			if j%2 == 0 {
				xs := make([]Extent, 1+(i*j)%3)
				if i == 200 {
					xs = make([]Extent, blockMax) // larger than a block
				}
				for k := range xs {
					xs[k] = Extent{Addr: uint64(i<<21 + k<<12), Len: uint64(4096 + j)}
				}
				args = append(args, NodeArg{Kind: ArgBuffer, Extents: xs})
				targs = append(targs, Arg{Kind: ArgBuffer, Bits: uint64(i << 12)})
			} else {
				args = append(args, NodeArg{Kind: ArgI64, Bits: uint64(i * j)})
				targs = append(targs, Arg{Kind: ArgF32, Bits: uint64(j)})
			}
		}
		nodes = append(nodes, NodeLaunch{Device: uint32(i % 2), Kernel: kernel, Args: args})
		tenants = append(tenants, Launch{Stream: uint32(i), Kernel: kernel, Args: targs})
	}
	var arena LaunchArena
	var gotNodes []NodeLaunch
	for i := range nodes {
		gotNodes = append(gotNodes, decodeBoth(t, Encode(&nodes[i]), arena.DecodeNodeLaunch, &nodes[i]))
	}
	// Overwrite every decoded element: a slice shared between launches
	// would change another's.
	for i := range gotNodes {
		for j := range gotNodes[i].Args {
			a := &gotNodes[i].Args[j]
			a.Bits = ^a.Bits
			for k := range a.Extents {
				a.Extents[k].Len = ^a.Extents[k].Len
			}
		}
	}
	for i := range gotNodes {
		for j, a := range gotNodes[i].Args {
			if a.Bits != ^nodes[i].Args[j].Bits {
				t.Fatalf("node launch %d argument %d shares its element with another launch", i, j)
			}
			for k, x := range a.Extents {
				if x.Len != ^nodes[i].Args[j].Extents[k].Len {
					t.Fatalf("node launch %d argument %d extent %d shares its element with another launch", i, j, k)
				}
			}
		}
	}
	for i := range tenants {
		decodeBoth(t, Encode(&tenants[i]), arena.DecodeLaunch, &tenants[i])
	}
	// Every truncation fails as Unmarshal fails.
	body, tbody := Encode(&nodes[4]), Encode(&tenants[4])
	for n := range len(body) {
		decodeBoth(t, body[:n], arena.DecodeNodeLaunch, nil)
	}
	for n := range len(tbody) {
		decodeBoth(t, tbody[:n], arena.DecodeLaunch, nil)
	}
}

// DecodeNodeAccessInto decodes as the generated Unmarshal does — the same
// message or the same error — with room enough for the extents, with too
// little, and with none, and it uses room when the extents fit.
func TestDecodeNodeAccessIntoDecodesAsUnmarshal(t *testing.T) {
	room := make([]Extent, 2)
	for n := range 4 {
		m := NodeAccess{Device: uint32(n), Extents: []Extent{}, Value: byte(n), Payload: []byte{}}
		for i := range n {
			m.Extents = append(m.Extents, Extent{Addr: uint64(i) << 12, Len: uint64(n + i)})
		}
		if n == 3 {
			m.Payload = []byte("payload")
		}
		for _, r := range [][]Extent{room, nil} {
			into := func(d *wire.Decoder, got *NodeAccess) { DecodeNodeAccessInto(d, got, r) }
			got := decodeBoth(t, Encode(&m), into, &m)
			if inRoom := len(got.Extents) > 0 && &got.Extents[0] == &room[0]; inRoom != (r != nil && n <= len(room) && n > 0) {
				t.Errorf("%d extents, room of %d: decoded into the room: %v", n, len(r), inRoom)
			}
			body := Encode(&m)
			for cut := range len(body) - len(m.Payload) { // any payload is whole
				decodeBoth(t, body[:cut], into, nil)
			}
		}
	}
}

// decodeBoth decodes body with the generated Unmarshal and with arena and
// fails unless both give sent, or (sent nil) both fail alike.
func decodeBoth[M any, PM interface {
	*M
	Unmarshal(*wire.Decoder)
}](t *testing.T, body []byte, arena func(*wire.Decoder, PM), sent PM) M {
	t.Helper()
	var want, got M
	wd, gd := wire.NewDecoder(body), wire.NewDecoder(body)
	PM(&want).Unmarshal(wd)
	arena(gd, &got)
	we, ge := wd.Finish(), gd.Finish()
	if sent == nil {
		if ge == nil || fmt.Sprint(we) != fmt.Sprint(ge) {
			t.Fatalf("%T of %d bytes: arena's error %v, Unmarshal's %v", got, len(body), ge, we)
		}
		return got
	}
	if we != nil || ge != nil {
		t.Fatalf("%T: errors %v and %v", got, we, ge)
	}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got, *sent) {
		t.Fatalf("arena decoded %+v, Unmarshal %+v, sent %+v", got, want, *sent)
	}
	return got
}

// A batch of launches of one kernel with two arguments allocates a few
// times in all through an arena, not a few times a launch.
func TestLaunchArenaAllocatesPerBlock(t *testing.T) {
	body := Encode(&NodeLaunch{Kernel: "fill_f32", Args: []NodeArg{
		{Kind: ArgBuffer, Extents: []Extent{{Addr: 1 << 21, Len: 4}}}, {Kind: ArgI64, Bits: 1}}})
	const launches = 1000
	allocs := testing.AllocsPerRun(5, func() {
		var arena LaunchArena
		for range launches {
			var l NodeLaunch
			d := wire.NewDecoder(body)
			arena.DecodeNodeLaunch(d, &l)
			if err := d.Finish(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs > 20 {
		t.Fatalf("%v allocations for %d launches through one arena, want at most 20", allocs, launches)
	}
}
