package sim

import (
	"bytes"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// resident is d.Resident, failing t on an error.
func resident(t *testing.T, d *Device) uint64 {
	t.Helper()
	n, err := d.Resident()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAlias: aliased ranges read their source's physical memory, which is
// stored once; unaliasing with keep gives a range a copy of its own that
// writes do not share, without keep zeros. Bad ranges are refused.
func TestAlias(t *testing.T) {
	const (
		frame   = 2 << 20
		aliases = 32
	)
	d := newDevice(t, (aliases+2)*frame)
	want := pattern(9, frame)
	for i := range aliases + 1 {
		if err := d.Write([]api.Extent{{Addr: uint64(i) * frame, Len: frame}}, want); err != nil {
			t.Fatal(err)
		}
	}
	before := resident(t, d)
	for i := 1; i <= aliases; i++ {
		if err := d.Alias(uint64(i)*frame, 0, frame); err != nil {
			t.Fatal(err)
		}
	}
	after := resident(t, d)
	t.Logf("%d identical frames and their source: %d MiB resident copied, %d MiB aliased", aliases, before>>20, after>>20)
	if before < (aliases+1)*frame || after > 2*frame {
		t.Fatalf("resident %d bytes with copies, %d aliased: want %d and at most %d", before, after, (aliases+1)*frame, 2*frame)
	}
	for i := range aliases + 1 {
		if got := read(t, d, api.Extent{Addr: uint64(i) * frame, Len: frame}); !bytes.Equal(got, want) {
			t.Fatalf("frame %d does not read its source's bytes", i)
		}
	}
	// A read across the boundary of an aliased range and its neighbour.
	if got := read(t, d, api.Extent{Addr: aliases*frame + frame - 8, Len: 16}); !bytes.Equal(got, append(bytes.Clone(want[frame-8:]), make([]byte, 8)...)) {
		t.Fatal("a read across an aliased range's end differs")
	}

	// Unaliased with keep: the same bytes, its own.
	if err := d.Unalias(frame, frame, true); err != nil {
		t.Fatal(err)
	}
	if err := d.Fill([]api.Extent{{Addr: frame, Len: 4096}}, 0xee); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, api.Extent{Addr: 0, Len: frame}); !bytes.Equal(got, want) {
		t.Fatal("a write to an unaliased copy reached its source")
	}
	if got := read(t, d, api.Extent{Addr: frame + 4096, Len: frame - 4096}); !bytes.Equal(got, want[4096:]) {
		t.Fatal("unaliasing with keep lost bytes")
	}
	// Without keep: zeros, and the source stays.
	if err := d.Unalias(2*frame, frame, false); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, api.Extent{Addr: 2 * frame, Len: frame}); !bytes.Equal(got, make([]byte, frame)) {
		t.Fatal("unaliasing without keep left bytes")
	}
	if got := read(t, d, api.Extent{Addr: 3 * frame, Len: frame}); !bytes.Equal(got, want) {
		t.Fatal("unaliasing one alias changed another")
	}
	for i := 3; i <= aliases; i++ {
		if err := d.Unalias(uint64(i)*frame, frame, false); err != nil {
			t.Fatal(err)
		}
	}
	// Frame 2 was read, which commits pages of a memory file too; so was a
	// page of frame aliases+1, which stays.
	for _, f := range []uint64{0, 2} {
		if err := d.Scrub(f*frame, frame); err != nil {
			t.Fatal(err)
		}
	}
	if n := resident(t, d); n < frame || n > frame+64<<10 {
		t.Fatalf("%d bytes resident with one frame written", n)
	}
	if got := read(t, d, api.Extent{Addr: 0, Len: 2 * frame}); !bytes.Equal(got[:frame], make([]byte, frame)) || got[frame] != 0xee {
		t.Fatal("scrubbing the source after its aliases left changed the wrong memory")
	}

	const size = (aliases + 2) * frame
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		parts    []string
	}{
		{"unaligned", d.Alias(frame+1, 0, frame), api.ErrInvalidArgument, []string{"0x200001"}},
		{"empty", d.Alias(frame, 0, 0), api.ErrInvalidArgument, []string{"alias"}},
		{"overlapping", d.Alias(frame, frame/2, frame), api.ErrInvalidArgument, []string{"overlaps"}},
		{"source outside", d.Alias(0, size, frame), api.ErrInvalidAddress, []string{"outside"}},
		{"outside", d.Unalias(size, frame, true), api.ErrInvalidAddress, []string{"outside"}},
	} {
		wantErr(t, tc.name, tc.err, tc.sentinel, tc.parts...)
	}
}
