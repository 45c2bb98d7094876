package memory

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// fakeNode is a test double of a node's frame allocator, shared by several
// spaces through leases. It hands each frame to at most one lessee, records
// any Return of a frame the caller does not hold (a double return, or one
// that would free another tenant's memory), and keeps the bytes of written
// frames so data can be checked through translations; Return scrubs them.
type fakeNode struct {
	mu       sync.Mutex
	capacity int  // frames per device
	scatter  bool // grant frames in descending order, never contiguous ascending
	// failGrant, when set, makes the next Grant fail with it.
	failGrant error
	// failReturn, when set, makes every Return fail with it after taking
	// the frames (the reply was lost, not the request).
	failReturn error
	owner      map[devFrame]int
	data       map[devFrame][]byte
	returns    map[int][]devFrame // every frame each lessee returned, in order
	violations []string
}

func newFakeNode(capacity int) *fakeNode {
	return &fakeNode{
		capacity: capacity,
		owner:    make(map[devFrame]int),
		data:     make(map[devFrame][]byte),
		returns:  make(map[int][]devFrame),
	}
}

// lease is the FrameSource of one lessee (one Space).
type lease struct {
	n  *fakeNode
	id int
}

func (n *fakeNode) lease(id int) lease { return lease{n, id} }

func (l lease) Grant(dev uint32, count int) ([]uint64, error) {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.failGrant; err != nil {
		n.failGrant = nil
		return nil, err
	}
	free := func(i int) bool { _, used := n.owner[devFrame{dev, uint64(i) * FrameSize}]; return !used }
	var got []int
	if !n.scatter {
		for start := 0; start+count <= n.capacity && got == nil; start++ {
			run := 0
			for run < count && free(start+run) {
				run++
			}
			if run == count {
				for i := range count {
					got = append(got, start+i)
				}
			}
		}
	}
	for i := n.capacity - 1; got == nil || len(got) < count; i-- {
		if i < 0 {
			return nil, fmt.Errorf("device %d: %d frames wanted, fewer free: %w", dev, count, api.ErrOutOfMemory)
		}
		if free(i) {
			got = append(got, i)
		}
	}
	frames := make([]uint64, count)
	for k, i := range got {
		frames[k] = uint64(i) * FrameSize
		n.owner[devFrame{dev, frames[k]}] = l.id
	}
	return frames, nil
}

func (l lease) Return(dev uint32, frames []uint64) error {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, f := range frames {
		k := devFrame{dev, f}
		if o, ok := n.owner[k]; !ok || o != l.id {
			n.violations = append(n.violations, fmt.Sprintf("lessee %d returned frame %#x of device %d, which it does not hold", l.id, f, dev))
			continue
		}
		delete(n.owner, k)
		delete(n.data, k)
		n.returns[l.id] = append(n.returns[l.id], k)
	}
	return n.failReturn
}

// held returns the frames lessee id holds.
func (n *fakeNode) held(id int) map[devFrame]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := make(map[devFrame]bool)
	for k, o := range n.owner {
		if o == id {
			m[k] = true
		}
	}
	return m
}

// bytes returns the model memory of the frame at pa, which must be leased.
func (n *fakeNode) bytes(dev uint32, pa uint64) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := devFrame{dev, pa &^ (FrameSize - 1)}
	b := n.data[k]
	if b == nil {
		b = make([]byte, FrameSize)
		n.data[k] = b
	}
	return b
}

// stampPages writes, at the start of every 4 KiB physical page of xs, a
// word naming the allocation (tag) and the page's offset in it. Placement
// works in whole pages, so this catches any misplacement or overlap.
func (n *fakeNode) stampPages(dev uint32, xs []api.Extent, tag uint64) {
	var off uint64
	for _, x := range xs {
		for p := x.Addr; p < x.Addr+x.Len; p += Page4K {
			b := n.bytes(dev, p)
			binary.LittleEndian.PutUint64(b[p%FrameSize:], tag<<32|off/Page4K)
			binary.LittleEndian.PutUint64(b[p%FrameSize+Page4K-8:], ^(tag<<32 | off/Page4K))
			off += Page4K
		}
	}
}

// checkStamps verifies what stampPages wrote; it returns a description of
// the first mismatch.
func (n *fakeNode) checkStamps(dev uint32, xs []api.Extent, tag uint64) error {
	var off uint64
	for _, x := range xs {
		for p := x.Addr; p < x.Addr+x.Len; p += Page4K {
			b := n.bytes(dev, p)
			want := tag<<32 | off/Page4K
			got := binary.LittleEndian.Uint64(b[p%FrameSize:])
			got2 := ^binary.LittleEndian.Uint64(b[p%FrameSize+Page4K-8:])
			if got != want || got2 != want {
				return fmt.Errorf("page at physical %#x (offset %#x of allocation %d): stamps %#x/%#x, want %#x", p, off, tag, got, got2, want)
			}
			off += Page4K
		}
	}
	return nil
}
