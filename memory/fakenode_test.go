package memory

import (
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
)

// fakeNode is a test double of a node's frame allocator, shared by several
// spaces through leases. It hands each frame to at most one lessee, records
// any Return, Read, Write or Zero of a frame the caller does not hold (a
// double return, or one that would touch another tenant's memory), and
// keeps the bytes of written frames so data can be checked through
// translations; Return scrubs them. Like a node, it refuses to write or
// clear a frame sealed (seal) until it is returned.
type fakeNode struct {
	mu       sync.Mutex
	capacity int  // frames per device
	scatter  bool // grant frames in descending order, never contiguous ascending
	// failGrant, when set, makes the next Grant fail with it.
	failGrant error
	// failReturn, when set, makes every Return fail with it after taking
	// the frames (the reply was lost, not the request).
	failReturn error
	// failIO, when set, makes the next Read, Write or Zero fail with it.
	failIO error
	// Frames copied by Read and by Write, and cleared by Zero.
	reads, writes, zeros int
	owner                map[devFrame]int
	data                 map[devFrame][]byte
	sealed               map[devFrame]bool
	returns              map[int][]devFrame // every frame each lessee returned, in order
	// kept holds the bytes of sealed frames returned, by SHA-256, for
	// refills (refillingLease), as a node retains sealed frames.
	kept       map[[32]byte][]byte
	violations []string
}

func newFakeNode(capacity int) *fakeNode {
	return &fakeNode{
		capacity: capacity,
		owner:    make(map[devFrame]int),
		data:     make(map[devFrame][]byte),
		sealed:   make(map[devFrame]bool),
		returns:  make(map[int][]devFrame),
		kept:     make(map[[32]byte][]byte),
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
		for start := 0; start+count <= n.capacity && got == nil; {
			run := 0
			for run < count && free(start+run) {
				run++
			}
			if run < count {
				start += run + 1 // no run of count starts before the used frame
				continue
			}
			for i := range count {
				got = append(got, start+i)
			}
		}
	}
	for i := n.capacity - 1; got == nil || len(got) < count; i-- {
		if i < 0 {
			return nil, fmt.Errorf("device %d: %d frames wanted, fewer free: %w", dev, count, vocab.ErrOutOfMemory)
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
		delete(n.sealed, k)
		n.returns[l.id] = append(n.returns[l.id], k)
	}
	return n.failReturn
}

// access checks that lessee l holds frame and consumes failIO. The caller
// holds n.mu.
func (l lease) access(op string, dev uint32, frame uint64, p []byte) error {
	n := l.n
	if err := n.failIO; err != nil {
		n.failIO = nil
		return err
	}
	if o, ok := n.owner[devFrame{dev, frame}]; !ok || o != l.id || frame%FrameSize != 0 {
		n.violations = append(n.violations, fmt.Sprintf("lessee %d: %s of frame %#x of device %d, which it does not hold", l.id, op, frame, dev))
		return fmt.Errorf("%s frame %#x of device %d: not held: %w", op, frame, dev, vocab.ErrInvalidAddress)
	}
	if op != "read" && n.sealed[devFrame{dev, frame}] {
		n.violations = append(n.violations, fmt.Sprintf("lessee %d: %s of sealed frame %#x of device %d", l.id, op, frame, dev))
		return fmt.Errorf("%s frame %#x of device %d: sealed: %w", op, frame, dev, vocab.ErrPermissionDenied)
	}
	if p != nil && len(p) != FrameSize {
		n.violations = append(n.violations, fmt.Sprintf("lessee %d: %s of %d bytes", l.id, op, len(p)))
		return fmt.Errorf("%s of %d bytes: %w", op, len(p), vocab.ErrInvalidArgument)
	}
	return nil
}

func (l lease) Read(dev uint32, frame uint64, p []byte) error {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := l.access("read", dev, frame, p); err != nil {
		return err
	}
	n.reads++
	if b := n.data[devFrame{dev, frame}]; b != nil {
		copy(p, b)
	} else {
		clear(p)
	}
	return nil
}

func (l lease) Write(dev uint32, frame uint64, p []byte) error {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := l.access("write", dev, frame, p); err != nil {
		return err
	}
	n.writes++
	k := devFrame{dev, frame}
	b := n.data[k]
	if b == nil {
		b = make([]byte, FrameSize)
		n.data[k] = b
	}
	copy(b, p)
	return nil
}

func (l lease) Zero(dev uint32, frame uint64) error {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := l.access("zero", dev, frame, nil); err != nil {
		return err
	}
	n.zeros++
	clear(n.data[devFrame{dev, frame}])
	return nil
}

// seal makes the frames of xs, which lessee l must hold, read-only until
// they are returned, as a node's seal does.
func (l lease) seal(dev uint32, xs []vocab.Extent) {
	n := l.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range xs {
		for f := x.Addr; f < x.Addr+x.Len; f += FrameSize {
			if o, ok := n.owner[devFrame{dev, f}]; !ok || o != l.id || f%FrameSize != 0 {
				n.violations = append(n.violations, fmt.Sprintf("lessee %d: seal of frame %#x of device %d, which it does not hold", l.id, f, dev))
				continue
			}
			n.sealed[devFrame{dev, f}] = true
		}
	}
}

// free returns the number of frames of dev no lessee holds.
func (n *fakeNode) free(dev uint32) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	used := 0
	for k := range n.owner {
		if k.dev == dev {
			used++
		}
	}
	return n.capacity - used
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

// readCount returns the frames read so far.
func (n *fakeNode) readCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reads
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
