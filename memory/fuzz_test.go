package memory

import (
	"encoding/binary"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
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
// node, the second with a quota; either may oversubscribe, with a cap, into
// a small host store that may spill. It checks every invariant after each
// operation.
func FuzzSpace(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 0, 0, 0, 0, 0, 16, 9, 0, 0, 0, 1, 0, 2, 0, 0, 3, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{12, 1, 8, 0, 0, 0, 0, 0, 0, 0, 32, 12, 0, 0, 0, 128, 13, 2, 0, 0, 5, 0, 1, 0, 255, 9, 4, 1, 1, 2, 0, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 5, 1, 1, 0, 0, 20, 0, 1, 0, 0, 0, 200, 2, 1, 0, 4, 0, 3, 1, 7, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 0x1d, 0x12, 1, 2, 0, 0, 0, 8, 0, 0, 16, 21, 6, 0, 0, 0, 0, 7, 0, 1, 0, 0, 0, 3, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 1, 8, 0, 0, 0, 0, 1, 2, 3, 4})
	f.Add([]byte{2, 1, 0, 0xff, 0x0e, 0, 1, 1, 0, 0, 16, 0, 0, 16, 21, 0, 1, 1, 0, 16, 21, 6, 0, 0, 0, 0, 8, 1, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &fuzzInput{b}
		node := newFakeNode(1 + int(in.u8()%12))
		node.scatter = in.u8()&1 == 1
		cfgs := limitsOnly([]uint64{0, uint64(in.u8()) << 18})
		// Oversubscription: bit i of over makes space i oversubscribe, with
		// a cap of (over>>2)%4 frames (then >>4 for the second); the store
		// has (store%5) frames of RAM and a spill file of (store>>3)%4
		// frames (0: none, 3: no limit); bit 7 of store picks lending.
		over, store := in.u8(), in.u8()
		var cs *checkedStore
		if over&3 != 0 {
			spill := ""
			if (store>>3)%4 != 0 {
				spill = dir
			}
			hs, err := NewHostStore(uint64(store%5)*FrameSize, spill)
			if err != nil {
				t.Fatal(err)
			}
			if l := (store >> 3) % 4; l == 1 || l == 2 {
				hs.SetSpillLimit(uint64(l) * FrameSize)
			}
			cs = newCheckedStore(hs, store&0x80 != 0)
			for i := range cfgs {
				cfgs[i].oversub = over&(1<<i) != 0
				cfgs[i].resident = int(over>>(2+2*i)) % 4
				if cfgs[i].oversub && cfgs[i].limit == 0 {
					// Bound what a space that need not fit in the node
					// may allocate, to keep each input fast.
					cfgs[i].limit = 32 << 20
				}
			}
		}
		h := newHarness(t, node, cs, cfgs)
		for step := 0; step < 64 && in.more(); step++ {
			op, si := in.u8(), int(in.u8()%2)
			switch op % 10 {
			case 0, 1:
				d := in.u8() // the device, and above it the hint
				h.alloc(si, uint32(d%2), in.size(), vocab.Hint(d/2%6))
			case 2:
				h.free(si, int(in.u8()))
			case 3:
				h.translate(si, int(in.u8()), uint64(in.u32()), uint64(in.u32()))
			case 4:
				h.misuse(si, int(in.u8()), int(in.u8()), uint64(in.u32()))
			case 5:
				h.failingGrant(si, uint32(in.u8()%2), in.size(), vocab.HintNone)
			case 6:
				h.write(si, int(in.u8()), uint64(in.u32()), uint64(in.u32()))
			case 7:
				if cs != nil {
					h.evict(si, int(in.u8()), uint64(in.u32()), in.u8()&1 == 1)
				}
			case 8:
				if cs != nil {
					h.failingIO(si, int(in.u8()), uint64(in.u32()), uint64(in.u32()), in.u8()&1 == 1)
				}
			case 9:
				picks := []int{int(in.u8()), int(in.u8())}
				h.translateAll(si, picks, []uint64{uint64(in.u32()), uint64(in.u32()), uint64(in.u32()), uint64(in.u32())}, nil)
			}
			h.check()
		}
		h.closeAll([]int{1, 0})
	})
}
