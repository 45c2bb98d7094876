package api

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpu/vgpu/api/wire"
)

// What the roles' messages share: Encode and Decode, kernels and their
// arguments (the catalog every peer can list), runs of device memory,
// batches of commands (a tenant's stream and a mediator's node commands),
// graph handles, versions and grants of shared buffers. Each role's own
// messages are in tenant*.go, operator*.go and node*.go; the handshake in
// hello.go.

// Message is a request or reply body with a fixed layout.
type Message interface {
	Marshal(e *wire.Encoder)
	Unmarshal(d *wire.Decoder)
}

// Encode returns m's wire form.
func Encode(m Message) []byte {
	// Room for a typical small message up front: growing from nothing
	// costs an allocation per doubling.
	e := wire.Encoder{B: make([]byte, 0, 64)}
	m.Marshal(&e)
	return e.B
}

// Decode fills m from b, rejecting short, malformed and over-long bodies.
func Decode(b []byte, m Message) error {
	d := wire.NewDecoder(b)
	m.Unmarshal(d)
	return d.Finish()
}

// ArgKind is the type of a kernel argument.
type ArgKind uint8

// Argument kinds.
const (
	ArgBuffer ArgKind = 1 // a device address (tenant) or extents (node)
	ArgI64    ArgKind = 2
	ArgF32    ArgKind = 3
)

func (k ArgKind) String() string {
	switch k {
	case ArgBuffer:
		return "buffer"
	case ArgI64:
		return "i64"
	case ArgF32:
		return "f32"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Arg is a kernel argument as a tenant gives it: a scalar or a device address.
type Arg struct {
	Kind ArgKind
	Bits uint64 // the address, the int64, or the float32's bits
}

// Access says how a kernel uses a buffer parameter.
type Access uint8

// Buffer accesses.
const (
	AccessNone Access = iota // scalars
	AccessRead
	AccessWrite
	AccessReadWrite
)

// Param is one parameter of a kernel's signature. A buffer parameter says
// how many bytes the kernel touches: Elem times the product of the scalar
// parameters named in Dims (Elem alone when Dims is empty), so a mediator
// can make resident just that, not the whole allocation behind a pointer.
// DType is a buffer's element type; 0 on the wire means f32 (kernels
// that predate it take f32 data but for index buffers, which say i32).
type Param struct {
	Name   string
	Kind   ArgKind
	Access Access
	Elem   uint8
	Dims   []string `wire:"nilempty"`
	DType  DType
}

// Extent is the number of bytes the kernel touches through buffer
// parameter i given args, or false when args do not determine it (a
// missing or negative dimension, an overflow): then all of the buffer
// may be touched.
func (k *KernelInfo) Extent(i int, args []Arg) (uint64, bool) {
	if i >= len(k.Params) || k.Params[i].Kind != ArgBuffer || k.Params[i].Elem == 0 {
		return 0, false
	}
	n := uint64(k.Params[i].Elem)
	for _, dim := range k.Params[i].Dims {
		j := slices.IndexFunc(k.Params, func(p Param) bool { return p.Name == dim && p.Kind == ArgI64 })
		if j < 0 || j >= len(args) || args[j].Kind != ArgI64 || int64(args[j].Bits) < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(n, args[j].Bits)
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// KernelInfo describes a kernel in a node's catalog.
type KernelInfo struct {
	Name   string
	Doc    string
	Params []Param
}

// KernelList is the catalog.
//
//vgpu:wire
type KernelList struct{ Kernels []KernelInfo }

// ExtentsPrefix returns the extents of the first n bytes of xs (all of xs
// when they hold no more), sharing xs's array up to the last, which is
// copied if cut.
func ExtentsPrefix(xs []Extent, n uint64) []Extent {
	for i, x := range xs {
		if x.Len >= n {
			out := xs[: i+1 : i+1]
			if x.Len > n {
				out = append(xs[:i:i], Extent{Addr: x.Addr, Len: n})
			}
			return out
		}
		n -= x.Len
	}
	return xs
}

// ExtentsOverlap reports whether a byte lies in an extent of a and in an
// extent of b, in O((len(a)+len(b)) log) time; without sorting, or
// allocating, where each holds one extent.
func ExtentsOverlap(a, b []Extent) bool {
	if len(a) <= 1 && len(b) <= 1 {
		return len(a) == 1 && len(b) == 1 && extentsMeet(a[0], b[0])
	}
	byAddr := func(x, y Extent) int { return cmp.Compare(x.Addr, y.Addr) }
	a, b = slices.SortedFunc(slices.Values(a), byAddr), slices.SortedFunc(slices.Values(b), byAddr)
	for i, j := 0, 0; i < len(a) && j < len(b); {
		x, y := a[i], b[j]
		switch {
		case extentsMeet(x, y):
			return true
		case x.Len == 0 || y.Len != 0 && x.Addr < y.Addr:
			i++ // x ends before y, and every later extent of b, starts
		default:
			j++
		}
	}
	return false
}

// extentsMeet reports whether x and y share a byte. It compares
// differences, not ends, which may overflow.
func extentsMeet(x, y Extent) bool {
	if x.Len == 0 || y.Len == 0 {
		return false
	}
	if x.Addr <= y.Addr {
		return y.Addr-x.Addr < x.Len
	}
	return x.Addr-y.Addr < y.Len
}

// F32Bits packs a float32 argument into Arg.Bits.
func F32Bits(v float32) uint64 { return uint64(math.Float32bits(v)) }

// F32FromBits unpacks a float32 argument from Arg.Bits.
func F32FromBits(b uint64) float32 { return math.Float32frombits(uint32(b)) }

// Cmd is one command of a Batch: an operation and its body, encoded as the
// operation's own request would be.
type Cmd struct {
	Op   wire.Op
	Body []byte
}

// Batch carries commands of one stream (or of a node connection) to be
// executed in order; it is answered once, when all of them have completed,
// with the first error any of them met (BatchError says which).
//
//vgpu:wire
type Batch struct {
	Stream uint32
	Cmds   []Cmd
}

// AppendCmd appends one command, encoded, to a batch body being built:
// Batch.Marshal's element format, without copying m through a Cmd.
func AppendCmd(b []byte, op wire.Op, m Message) []byte {
	e, at := BeginCmd(b, op)
	m.Marshal(&e)
	return EndCmd(e.B, at)
}

// BeginCmd and EndCmd are AppendCmd in two halves, for a caller that
// marshals a message of a type it knows between them: the call is direct
// then, and neither the message nor the encoder escapes to the heap (a
// tiny launch is queued without allocating). BeginCmd appends op and room
// for the length, which EndCmd fills in, given at.
func BeginCmd(b []byte, op wire.Op) (e wire.Encoder, at int) {
	e.B = b
	e.U16(uint16(op))
	at = len(e.B)
	e.U32(0)
	return e, at
}

// EndCmd: see BeginCmd.
func EndCmd(b []byte, at int) []byte {
	n := len(b) - at - 4
	b[at], b[at+1], b[at+2], b[at+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	return b
}

// BatchError is the failure of command Index of a batch.
type BatchError struct {
	Index int
	Op    wire.Op
	Err   error
}

func (e *BatchError) Error() string { return fmt.Sprintf("command %d (%v): %v", e.Index, e.Op, e.Err) }

func (e *BatchError) Unwrap() error { return e.Err }

// SplitBatchError takes apart the error reply to a batch, which crossed the
// wire as a RemoteError whose message BatchError.Error wrote: it returns the
// index of the failed command and its own error, with the same code.
func SplitBatchError(err error) (int, error, bool) {
	var re *RemoteError
	if !errors.As(err, &re) {
		return 0, nil, false
	}
	rest, ok := strings.CutPrefix(re.Msg, "command ")
	if !ok {
		return 0, nil, false
	}
	num, rest, ok := strings.Cut(rest, " (")
	if !ok {
		return 0, nil, false
	}
	i, perr := strconv.Atoi(num)
	_, msg, ok := strings.Cut(rest, "): ")
	if perr != nil || !ok || i < 0 {
		return 0, nil, false
	}
	return i, &RemoteError{Code: re.Code, Msg: msg}, true
}

// Graph names a captured command sequence.
//
//vgpu:wire
type Graph struct{ Graph uint32 }

// MaxGrants bounds the grants of one export. A node keeps them for the
// object's life, and a list as long as the wire allows (MaxList) would
// cost it some 3.5 MiB an object: mediators and nodes both refuse more.
const MaxGrants = 64

// Grant lets Tenant import a shared buffer, to read it, and to write it if
// Write.
type Grant struct {
	Tenant string
	Write  bool
}

// BufVersion is a version of a versioned shared buffer: the reply to a
// publish or a pin.
//
//vgpu:wire
type BufVersion struct{ Version uint64 }
