package wire

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
	"pgregory.net/rapid"
)

func TestDecoderPrimitives(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		u8, u16, u32, u64 := rapid.Uint8().Draw(t, "u8"), rapid.Uint16().Draw(t, "u16"), rapid.Uint32().Draw(t, "u32"), rapid.Uint64().Draw(t, "u64")
		i64 := rapid.Int64().Draw(t, "i64")
		f := math.Float32frombits(rapid.Uint32().Draw(t, "f32"))
		bl := rapid.Bool().Draw(t, "bool")
		s := rapid.StringN(0, 64, -1).Draw(t, "str")
		var e Encoder
		e.U8(u8)
		e.U16(u16)
		e.U32(u32)
		e.U64(u64)
		e.I64(i64)
		e.F32(f)
		e.Bool(bl)
		e.String(s)
		if len(e.B) != 1+2+4+8+8+4+1+4+len(s) {
			t.Fatalf("encoding is %d bytes", len(e.B))
		}
		d := NewDecoder(e.B)
		g8, g16, g32, g64, gi, gf, gb, gs := d.U8(), d.U16(), d.U32(), d.U64(), d.I64(), d.F32(), d.Bool(), d.Str()
		if err := d.Finish(); err != nil {
			t.Fatal(err)
		}
		if g8 != u8 || g16 != u16 || g32 != u32 || g64 != u64 || gi != i64 ||
			math.Float32bits(gf) != math.Float32bits(f) || gb != bl || gs != s {
			t.Fatalf("primitives did not round-trip")
		}
	})
}

func TestDecoderStickyError(t *testing.T) {
	d := NewDecoder([]byte{1, 2, 3, 4, 5})
	if v := d.U64(); v != 0 {
		t.Fatalf("U64 of 5 bytes = %d", v)
	}
	first := d.Finish()
	if !errors.Is(first, vocab.ErrProtocol) {
		t.Fatalf("short U64: %v", first)
	}
	// The bytes are still there, but a failed decoder reads nothing more.
	if v := d.U8(); v != 0 {
		t.Errorf("U8 after failure = %d", v)
	}
	if s := d.Str(); s != "" {
		t.Errorf("String after failure = %q", s)
	}
	if n := d.Len(1); n != 0 {
		t.Errorf("Len after failure = %d", n)
	}
	if r := d.Rest(); r != nil {
		t.Errorf("Rest after failure = %x", r)
	}
	if err := d.Finish(); err != first {
		t.Errorf("Finish changed from %v to %v", first, err)
	}
}

func TestDecoderBool(t *testing.T) {
	for b := 0; b < 256; b++ {
		d := NewDecoder([]byte{byte(b)})
		v := d.Bool()
		err := d.Finish()
		switch {
		case b <= 1 && (err != nil || v != (b == 1)):
			t.Errorf("Bool(%d) = %v, %v", b, v, err)
		case b > 1 && !errors.Is(err, vocab.ErrProtocol):
			t.Errorf("Bool(%d) = %v, %v; want vocab.ErrProtocol", b, v, err)
		}
	}
}

func TestDecoderLen(t *testing.T) {
	enc := func(n uint32, rest int) []byte {
		var e Encoder
		e.U32(n)
		e.B = append(e.B, make([]byte, rest)...)
		return e.B
	}
	for _, tc := range []struct {
		n       uint32
		rest    int
		minElem int
		ok      bool
	}{
		{0, 0, 8, true},
		{2, 16, 8, true},
		{2, 15, 8, false},
		{3, 0, 0, true}, // no minimum: only MaxList applies
		{MaxList, 0, 0, true},
		{MaxList + 1, 0, 0, false},
		{math.MaxUint32, 1 << 10, 1, false},
	} {
		d := NewDecoder(enc(tc.n, tc.rest))
		got := d.Len(tc.minElem)
		err := d.Err()
		if tc.ok && (err != nil || got != int(tc.n)) {
			t.Errorf("Len(%d) of %d with %d bytes left = %d, %v", tc.minElem, tc.n, tc.rest, got, err)
		}
		if !tc.ok && (got != 0 || !errors.Is(err, vocab.ErrProtocol)) {
			t.Errorf("Len(%d) of %d with %d bytes left = %d, %v; want vocab.ErrProtocol", tc.minElem, tc.n, tc.rest, got, err)
		}
	}
}

// TestNameOps: Op.String gives a registered name, op(N) otherwise, and a
// second name for a named operation panics.
func TestNameOps(t *testing.T) {
	const a, b Op = 60001, 60002
	NameOps(map[Op]string{a: "test-a"})
	NameOps(map[Op]string{a: "test-a", b: "test-b"}) // the same name again is fine
	if a.String() != "test-a" || b.String() != "test-b" || Op(60003).String() != "op(60003)" {
		t.Fatalf("names: %v %v %v", a, b, Op(60003))
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `named both "test-a" and "other"`) {
			t.Fatalf("renaming an operation: %v, want a panic naming both", r)
		}
	}()
	NameOps(map[Op]string{a: "other"})
}
