package cuda

import "unsafe"

// The package's pointer arithmetic on C memory: strings the driver returns
// and pinned host buffers.

// goString copies the NUL-terminated C string at s.
func goString(s *byte) string {
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(s), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(s, n))
}

// at returns the address of byte off of p, whose n bytes from there must
// lie inside p.
func (p *Pinned) at(off, n int) unsafe.Pointer {
	if off < 0 || n < 0 || off > p.n || n > p.n-off {
		panic("cuda: pinned buffer range out of bounds") // a bug of this package, not a request's
	}
	return unsafe.Add(p.p, off)
}

// Bytes is the pinned memory as a slice; it is valid until FreeHost.
func (p *Pinned) Bytes() []byte { return unsafe.Slice((*byte)(p.p), p.n) }
