package api

import "github.com/vgpu/vgpu/api/wire"

// LaunchArena decodes the launches of one batch so that they share their
// allocations: arguments and extents are cut from blocks that grow with the
// batch, and a kernel name that repeats the one before is that string
// again. A batch of tiny launches then allocates a few times a batch
// rather than two or three times a launch, on the mediator (Launch) and on
// the node (NodeLaunch).
//
// Invariant: no slice it hands out overlaps another or is handed out
// again (each is capped at its length), so a decoded launch may be kept,
// and its elements changed, for as long as its holder likes. The zero
// LaunchArena is ready; it is used by one goroutine at a time.
type LaunchArena struct {
	args    block[Arg]
	nodeArg block[NodeArg]
	extents block[Extent]
	kernel  string // the last kernel name decoded
}

// DecodeLaunch decodes m as Launch.Unmarshal does, from a's blocks.
func (a *LaunchArena) DecodeLaunch(d *wire.Decoder, m *Launch) {
	m.Stream = d.U32()
	m.Kernel = a.name(d)
	m.Args = a.args.take(d.Len(9)) // Len checked that the bytes are there
	for i := range m.Args {
		m.Args[i] = Arg{Kind: ArgKind(d.U8()), Bits: d.U64()}
	}
}

// DecodeNodeLaunch decodes m as NodeLaunch.Unmarshal does, from a's blocks.
func (a *LaunchArena) DecodeNodeLaunch(d *wire.Decoder, m *NodeLaunch) {
	m.Device = d.U32()
	m.Kernel = a.name(d)
	m.Args = a.nodeArg.take(d.Len(5))
	for i := range m.Args {
		p := &m.Args[i]
		if p.Kind = ArgKind(d.U8()); p.Kind == ArgBuffer {
			p.Extents = a.extents.take(d.Len(16))
			for j := range p.Extents {
				p.Extents[j] = Extent{Addr: d.U64(), Len: d.U64()}
			}
		} else {
			p.Bits = d.U64()
		}
		if d.Err() != nil {
			return
		}
	}
}

// name decodes a kernel name, the last one's string again if it repeats.
func (a *LaunchArena) name(d *wire.Decoder) string {
	a.kernel = d.StrLike(a.kernel)
	return a.kernel
}

// block hands out zeroed slices cut from a larger one. Blocks start small,
// so that a lone launch costs no more than its own slices, and double up to
// blockMax elements as a batch goes on; a request larger than a quarter of
// that gets a slice of its own.
type block[T any] struct {
	free []T // not yet handed out
	size int // the length of the last block made
}

// blockMax keeps the largest block (of NodeArgs, 40 bytes each) below the
// runtime's 32 KiB limit of small objects: a larger one is cleared and
// freed apart, which costs more than a few more blocks.
const blockMax = 512

func (b *block[T]) take(n int) []T {
	if n == 0 {
		return []T{} // empty but not nil, as Unmarshal's make gives
	}
	if n > len(b.free) {
		if n > blockMax/4 {
			return make([]T, n)
		}
		b.size = min(max(2*b.size, 8, n), blockMax)
		b.free = make([]T, b.size)
	}
	s := b.free[:n:n]
	b.free = b.free[n:]
	return s
}

// DecodeNodeAccessInto decodes m as NodeAccess.Unmarshal does, its extents
// into room's array when they fit there (else a new one): a node reading a
// small piece of memory for its mediator, one request at a time per
// connection, reuses one array rather than allocate per read (#25). m's
// extents then alias room, and its payload the decoder's bytes, until the
// caller decodes into room again.
func DecodeNodeAccessInto(d *wire.Decoder, m *NodeAccess, room []Extent) {
	m.Device = d.U32()
	if n := d.Len(16); room != nil && n <= cap(room) {
		m.Extents = room[:n]
	} else {
		m.Extents = make([]Extent, n)
	}
	for i := range m.Extents {
		m.Extents[i] = Extent{Addr: d.U64(), Len: d.U64()}
	}
	m.Value = d.U8()
	m.Payload = d.Rest()
}
