// Package coherence owns the consistency of buffers shared by tenants on
// several mediators: the directory at the buffer's home node (Home), the
// copies of its pages kept on each mediator's host (Cache), the buffer's
// mode (api.Mode), page versions and read leases. docs/coherence.md
// describes the protocol, its messages and transitions, and what each mode
// promises.
//
// Both sides are pure, deterministic state machines: they send nothing,
// start no goroutines and read no clock. The embedding code (the node for a
// Home, the mediator for a Cache) delivers each message by a method call,
// passes the current time as now, a reading of its own monotonic clock, and
// sends the messages a call's result asks for. The same types are what the
// model checker in model_test.go explores exhaustively.
//
// The protocol is write-through and home-based. Data lives at the home;
// a write is applied there, so it survives any mediator's death once
// acknowledged, and kernels on the node see every acknowledged write. A
// mediator caches a page of a coherent buffer under a read lease; before a
// write is applied the home invalidates every other copy whose lease has
// not expired, and waits at most a lease for a copy whose holder does not
// answer. Versioned and sealed immutable buffers never change once read,
// so their copies are cached until evicted and cost no messages at all.
//
// Invariants (between calls), proved for small configurations by the model
// checker and for random runs by the property test:
//   - Single writer: a page has at most one write in progress; others wait
//     in FIFO order behind it, and while any waits the home registers no
//     new lease on the page.
//   - A cached copy of a coherent page whose lease has not expired has the
//     page's latest committed version and data, provided the cache's clock
//     runs no faster than the margin allows (docs/coherence.md, Leases).
//   - Every write the home has committed stays in the page's data, in
//     commit order; versions count the commits of each page.
//
// Neither type locks: each must be used by one goroutine at a time (the
// embedding code holds its own lock across a call and the sends it asks
// for), so this package adds nothing to any lock order.
package coherence

import (
	"math"
	"time"
)

// CacheID names a mediator's cache to a home: one per mediator connection
// to the node. A home treats an id that never reads as a writer only, so a
// node that writes a page itself (a kernel) uses an id of its own.
type CacheID uint32

// Forever is a lease that never expires: the copy stays valid until it is
// evicted or its object dropped.
const Forever time.Duration = math.MaxInt64

// ReadGrant is the home's answer to a read of one page: the version it
// returns and for how long the reader may keep a copy.
type ReadGrant struct {
	// Version of the page's data in the reply. Coherent, private and
	// immutable pages count their committed writes from 0; a versioned
	// page has the version that was read.
	Version uint64
	// Lease is how long the reader may use a copy, counted on the reader's
	// clock from when it sent the read (Cache.Fill subtracts its margin):
	// 0 to use the reply once, Forever to keep it until evicted.
	Lease time.Duration
	// Sealed reports an immutable object that is sealed: the reader's
	// writes to it are refused without asking the home.
	Sealed bool
}

// Key names a cached page: a page of an object, and for versioned objects
// the version read. Pages of other modes have Version 0 (whatever version
// is current).
type Key struct {
	Object  uint64
	Version uint64
	Page    uint32
}
