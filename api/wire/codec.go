package wire

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vgpu/vgpu/api/vocab"
)

// MaxString bounds every string on the wire (names, messages).
const MaxString = 4096

// MaxList bounds every list on the wire (arguments, extents, frames, rows).
const MaxList = 1 << 16

// Encoder appends little-endian fields to a byte slice.
type Encoder struct{ B []byte }

func (e *Encoder) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Encoder) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }
func (e *Encoder) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Encoder) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Encoder) I64(v int64)  { e.U64(uint64(v)) }
func (e *Encoder) F32(v float32) {
	e.U32(math.Float32bits(v))
}
func (e *Encoder) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}
func (e *Encoder) String(s string) {
	e.U32(uint32(len(s)))
	e.B = append(e.B, s...)
}

// Decoder reads fields written by Encoder from untrusted bytes. The first
// failure sticks: later reads return zero values and Err reports it, so
// message decoders read straight through and check once.
type Decoder struct {
	b   []byte
	off int
	err error
}

// NewDecoder decodes b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

func (d *Decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b)-d.off < n {
		d.err = fmt.Errorf("decode %s: need %d bytes at offset %d, have %d: %w",
			what, n, d.off, len(d.b)-d.off, vocab.ErrProtocol)
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *Decoder) U8() uint8 {
	if p := d.take(1, "u8"); p != nil {
		return p[0]
	}
	return 0
}
func (d *Decoder) U16() uint16 {
	if p := d.take(2, "u16"); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}
func (d *Decoder) U32() uint32 {
	if p := d.take(4, "u32"); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}
func (d *Decoder) U64() uint64 {
	if p := d.take(8, "u64"); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}
func (d *Decoder) I64() int64   { return int64(d.U64()) }
func (d *Decoder) F32() float32 { return math.Float32frombits(d.U32()) }
func (d *Decoder) Bool() bool {
	switch v := d.U8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.Fail("bool byte %d is neither 0 nor 1", v)
		return false
	}
}

// Str reads a string. (Not String: that would make Decoder a fmt.Stringer.)
func (d *Decoder) Str() string { return d.StrLike("") }

// StrLike reads a string like Str, but returns prev itself, without
// allocating, when the bytes read spell it: a batch of launches of one
// kernel decodes the name once.
func (d *Decoder) StrLike(prev string) string {
	n := d.U32()
	if n > MaxString {
		d.Fail("string of %d bytes exceeds the limit of %d", n, MaxString)
		return ""
	}
	b := d.take(int(n), "string")
	if string(b) == prev {
		return prev
	}
	return string(b)
}

// Len reads a list length and checks it against MaxList and against the
// bytes left, given that each element needs at least minElem bytes, so a
// forged count cannot make the receiver allocate.
func (d *Decoder) Len(minElem int) int {
	n := d.U32()
	if d.err != nil {
		return 0
	}
	if n > MaxList {
		d.Fail("list of %d elements exceeds the limit of %d", n, MaxList)
		return 0
	}
	if minElem > 0 && int(n) > (len(d.b)-d.off)/minElem {
		d.Fail("list of %d elements does not fit in %d remaining bytes", n, len(d.b)-d.off)
		return 0
	}
	return int(n)
}

// Bytes returns the next n bytes without copying.
func (d *Decoder) Bytes(n int) []byte {
	if n > MaxBody {
		d.Fail("field of %d bytes exceeds the limit of %d", n, MaxBody)
		return nil
	}
	return d.take(n, "bytes")
}

// Rest returns the unread bytes (a bulk payload) without copying.
func (d *Decoder) Rest() []byte {
	if d.err != nil {
		return nil
	}
	p := d.b[d.off:]
	d.off = len(d.b)
	return p
}

// Fail records a decoding failure, unless one is already recorded: a
// check of a message's own (a field over its limit, an unknown kind of a
// tagged union) fails the whole decode with ErrProtocol, as a short body
// does.
func (d *Decoder) Fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("decode: "+format+": %w", append(args, vocab.ErrProtocol)...)
	}
}

// Err is the first failure so far, or nil: a decoder of a list stops at
// it rather than read zeros for the remaining elements.
func (d *Decoder) Err() error { return d.err }

// More says whether bytes remain to decode: an optional trailing field
// follows.
func (d *Decoder) More() bool { return d.err == nil && d.off < len(d.b) }

// Finish reports the first failure, or trailing bytes the message did not use.
func (d *Decoder) Finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.err = fmt.Errorf("decode: %d trailing bytes: %w", len(d.b)-d.off, vocab.ErrProtocol)
	}
	return d.err
}
