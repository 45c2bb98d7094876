package memory

import (
	"encoding/binary"
	"testing"
)

// fuzzInput reads operation parameters from fuzz bytes, yielding zeros
// once they run out.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) more() bool { return len(in.b) > 0 }

func (in *fuzzInput) u8() uint8 {
	if len(in.b) == 0 {
		return 0
	}
	v := in.b[0]
	in.b = in.b[1:]
	return v
}

func (in *fuzzInput) u32() uint32 {
	var p [4]byte
	for i := range p {
		p[i] = in.u8()
	}
	return binary.LittleEndian.Uint32(p[:])
}

// size spans 0 (invalid) to about 128 MiB, beyond what the node holds.
func (in *fuzzInput) size() uint64 {
	return uint64(in.u8())<<8 | uint64(in.u8())<<(in.u8()%20)
}

// FuzzSpace interprets its input as operations on two spaces sharing a
// node, the second with a quota, and checks every invariant after each.
func FuzzSpace(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 0, 16, 9, 0, 0, 0, 1, 0, 2, 0, 0, 3, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{12, 1, 8, 0, 0, 0, 32, 12, 0, 0, 0, 128, 13, 2, 0, 0, 5, 0, 1, 0, 255, 9, 4, 1, 1, 2, 0, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 5, 0, 0, 0, 0, 5, 1, 1, 0, 0, 20, 0, 1, 0, 0, 0, 200, 2, 1, 0, 4, 0, 3, 1, 7, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &fuzzInput{b}
		node := newFakeNode(1 + int(in.u8()%12))
		node.scatter = in.u8()&1 == 1
		h := newHarness(t, node, []uint64{0, uint64(in.u8()) << 18})
		for step := 0; step < 64 && in.more(); step++ {
			op, si := in.u8(), int(in.u8()%2)
			switch op % 6 {
			case 0, 1:
				h.alloc(si, uint32(in.u8()%2), in.size())
			case 2:
				h.free(si, int(in.u8()))
			case 3:
				h.translate(si, int(in.u8()), uint64(in.u32()), uint64(in.u32()))
			case 4:
				h.misuse(si, int(in.u8()), int(in.u8()), uint64(in.u32()))
			case 5:
				h.failingGrant(si, uint32(in.u8()%2), in.size())
			}
			h.check()
		}
		h.closeSpace(1)
		h.closeSpace(0)
		if n := len(node.owner); n != 0 {
			t.Fatalf("%d frames still leased after every space closed", n)
		}
	})
}
