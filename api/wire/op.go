package wire

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
)

// Op names a request: the operation field of a frame header. The numbers
// are part of the wire protocol; which ones exist, and the messages they
// carry, are the messages' business (package api declares the constants),
// not the wire's.
type Op uint16

// opNames holds the names NameOps registered. Lookups (Op.String, on error
// paths) load it without a lock; NameOps replaces it, under namesMu, with a
// copy that has the new names added.
var (
	opNames atomic.Pointer[map[Op]string]
	namesMu sync.Mutex // serialises NameOps
)

// NameOps registers the names Op.String gives to operations, so that the
// wire's errors ("frame 7 (malloc) announces …") say what a request was.
// A package of messages calls it from init. Naming an operation again
// with another name is a programming error and panics: two message sets
// would then share an opcode.
func NameOps(names map[Op]string) {
	namesMu.Lock()
	defer namesMu.Unlock()
	next := map[Op]string{}
	if old := opNames.Load(); old != nil {
		maps.Copy(next, *old)
	}
	for op, name := range names {
		if had, ok := next[op]; ok && had != name {
			panic(fmt.Sprintf("wire: operation %d named both %q and %q", uint16(op), had, name))
		}
		next[op] = name
	}
	opNames.Store(&next)
}

// String is the name NameOps gave o, or op(N).
func (o Op) String() string {
	if names := opNames.Load(); names != nil {
		if s, ok := (*names)[o]; ok {
			return s
		}
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}
