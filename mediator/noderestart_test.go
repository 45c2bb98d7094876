package mediator_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// A node that restarts comes back empty, and the session on it goes on:
// an ordinary buffer it held fails with ErrUnavailable naming the node; a
// sealed weight whose contents the other node holds reads back intact
// without the tenant sending a byte of it again; a sealed weight no other
// node holds fails the same typed way; buffers on the other node, and new
// allocations on the restarted one, work.
func TestNodeRestartKeepsSession(t *testing.T) {
	const size = 4 << 20
	sys := startNodes(t, 2, 1, 64<<20, func(c *mediator.Config) { c.WeightSums = true })
	c := sys.dial(t, "a", 2)
	devs := c.Devices()
	if devs[0].Node == devs[1].Node {
		t.Fatalf("both devices on node %s; the test needs one on each", devs[0].Node)
	}
	a, b := 0, 1 // a's node restarts
	addrA := devs[a].Node
	restartAt := 0
	if sys.med.Status().Nodes[1].Addr == addrA {
		restartAt = 1
	}

	shared, unique := randomBytes(1, size), randomBytes(2, size)
	st := c.Stream()
	weight := func(dev int, data []byte) client.Ptr {
		t.Helper()
		p, err := c.MallocWith(dev, size, client.AllocOptions{Hint: api.HintWeight})
		if err != nil {
			t.Fatal(err)
		}
		st.CopyToDevice(p, data)
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := c.Seal(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	weight(b, shared) // the other node's copy
	restorable := weight(a, shared)
	lostWeight := weight(a, unique)
	plain, err := c.Malloc(a, 4096)
	if err != nil {
		t.Fatal(err)
	}
	onB, err := c.Malloc(b, 4096)
	if err != nil {
		t.Fatal(err)
	}
	st.CopyToDevice(plain, shared[:4096])
	st.CopyToDevice(onB, unique[:4096])
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	before, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}

	sys.restartNode(t, restartAt, addrA)

	// The session's next requests find the node back, at the latest once
	// its watcher has redialled it: a new allocation there then works.
	fresh := mallocWhenBack(t, c, a)
	st.CopyToDevice(fresh, unique[:4096])
	got := make([]byte, 4096)
	st.CopyFromDevice(got, fresh)
	if err := st.Synchronize(); err != nil || !bytes.Equal(got, unique[:4096]) {
		t.Fatalf("new buffer on the restarted node: %v, equal %v", err, bytes.Equal(got, unique[:4096]))
	}

	// (a) An ordinary buffer on the node is lost, typed, naming the node.
	st.CopyFromDevice(got, plain)
	err = st.Synchronize()
	wantErr(t, err, api.ErrUnavailable, addrA+" restarted (boot ")

	// (b) The weight another node holds reads back whole, and the tenant
	// sent nothing for it.
	back := make([]byte, size)
	st.CopyFromDevice(back, restorable)
	if err := st.Synchronize(); err != nil {
		t.Fatalf("restored weight: %v", err)
	}
	if !bytes.Equal(back, shared) {
		t.Fatal("restored weight differs from what was sealed")
	}
	if n := mediator.NodeRestores(sys.med, c.Session()); n != 2 {
		t.Fatalf("%d chunks restored from another node, want the weight's 2", n)
	}
	after, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after.CopiedIn-before.CopiedIn != 4096 { // the new buffer's bytes only
		t.Fatalf("the tenant copied %d bytes in after the restart, want 4096 (the new buffer)", after.CopiedIn-before.CopiedIn)
	}
	if err := c.Free(restorable); err != nil {
		t.Fatal(err)
	}

	// (c) A weight that no other node holds is lost, typed, and says why.
	st.CopyFromDevice(back, lostWeight)
	err = st.Synchronize()
	wantErr(t, err, api.ErrUnavailable, addrA+" restarted (boot ", "not restored: ", "no other node holds a sealed copy")

	// The other node's buffer is intact, and lost buffers free.
	st.CopyFromDevice(got, onB)
	if err := st.Synchronize(); err != nil || !bytes.Equal(got, unique[:4096]) {
		t.Fatalf("buffer on the other node: %v", err)
	}
	for _, p := range []client.Ptr{plain, lostWeight, fresh} {
		if err := c.Free(p); err != nil {
			t.Fatalf("free %#x: %v", p, err)
		}
	}
}

// restartNode stops node i, at addr, and starts an empty one of one
// 64 MiB device at the same address, as a node that restarts comes back,
// and returns it, failing unless it drew another boot id.
func (s *system) restartNode(t *testing.T, i int, addr string) *accelerator.Node {
	t.Helper()
	before := s.nodes[i].Status().Boot
	s.nodes[i].Close()
	node, _, err := accelerator.StartSim(addr, 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	if now := node.Status().Boot; now == "" || now == before {
		t.Fatalf("the restarted node's boot id is %q, before %q: want a new one", now, before)
	}
	s.nodes[i] = node
	return node
}

// mallocWhenBack allocates 4 KiB on device dev, whose node restarted,
// trying again while that fails with ErrUnavailable (the session has not
// redialled the node yet), for up to 10 s.
func mallocWhenBack(t *testing.T, c *client.Client, dev int) client.Ptr {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := c.Malloc(dev, 4096)
		if err == nil {
			return p
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("malloc on the restarted node: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Without WeightSums, and on a single node, a sealed weight is lost like
// any buffer: the session still goes on.
func TestNodeRestartWithoutSums(t *testing.T) {
	sys := startNodes(t, 1, 1, 64<<20, nil)
	c := sys.dial(t, "a", 1)
	addr := c.Devices()[0].Node
	st := c.Stream()
	w, err := c.MallocWith(0, 2<<20, client.AllocOptions{Hint: api.HintWeight})
	if err != nil {
		t.Fatal(err)
	}
	st.CopyToDevice(w, randomBytes(3, 2<<20))
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}
	sys.restartNode(t, 0, addr)
	mallocWhenBack(t, c, 0)
	got := make([]byte, 64)
	st.CopyFromDevice(got, w)
	wantErr(t, st.Synchronize(), api.ErrUnavailable, addr+" restarted (boot ")
}

// A tensor graph registered on a node that restarted is gone with it: an
// invocation fails with ErrUnavailable naming the node, and writes none of
// its inputs through the physical addresses the graph was placed at, which
// the restarted node may have granted to the session's new allocations.
func TestNodeRestartEndsTensorGraphs(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := hostile(t, sys, "acme")
	const n = 3000
	w := seq(n, func(i int) float32 { return float32(i) / 3 })
	id := mustRegister(t, c, affineGraph(n, weight(t, c, w)))
	checkAffine(t, c, id, w, 1)
	addr := sys.med.Status().Nodes[0].Addr

	sys.restartNode(t, 0, addr)
	deadline := time.Now().Add(10 * time.Second)
	var fresh []uint64 // new allocations, which take the node's first frames again
	for len(fresh) == 0 {
		b, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 4 << 20}))
		if err == nil {
			var r api.MallocReply
			if err := api.Decode(b, &r); err != nil {
				t.Fatal(err)
			}
			fresh = append(fresh, r.Addr)
			break
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("malloc on the restarted node: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fresh = append(fresh, mallocRaw(t, c, 4<<20))
	const piece = 1 << 20 // what one inline copy carries
	pattern := bytes.Repeat([]byte{0x5a}, piece)
	for _, va := range fresh {
		for off := uint64(0); off < 4<<20; off += piece {
			putRaw(t, c, va+off, pattern)
		}
	}
	_, err := invoke(t, c, id, nil, bytes.Repeat([]byte{1}, 4*n))
	wantErr(t, err, api.ErrUnavailable, addr+" restarted (boot ", fmt.Sprintf("tensor graph %d", id))
	for _, va := range fresh {
		for off := uint64(0); off < 4<<20; off += piece {
			if !bytes.Equal(getRaw(t, c, va+off, piece), pattern) {
				t.Fatalf("the invocation of a graph of the restarted node wrote into the new allocation at %#x", va+off)
			}
		}
	}
	if err := release(t, c, id); err != nil {
		t.Fatalf("release of a graph of the restarted node: %v", err)
	}
}

// What the mediator holds itself survives a node restart: an
// oversubscribing session's chunk evicted to the host store reads back
// intact on the restarted node, while one resident there is lost.
func TestNodeRestartKeepsEvictedMemory(t *testing.T) {
	const chunk = 2 << 20
	sys := startOversubscribed(t, 64<<20, 2*chunk, 2, 64<<20) // two chunks resident at most
	c := sys.dial(t, "a", 1)
	addr := c.Devices()[0].Node
	st := c.Stream()
	var ps []client.Ptr
	var data [][]byte
	for i := range 3 { // the third evicts the first
		p, err := c.Malloc(0, chunk)
		if err != nil {
			t.Fatal(err)
		}
		ps, data = append(ps, p), append(data, randomBytes(uint64(10+i), chunk))
		st.CopyToDevice(p, data[i])
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	if n := mediator.SessionEvictions(sys.med, c.Session()); n != 1 {
		t.Fatalf("%d evictions before the restart, want the first buffer's", n)
	}

	sys.restartNode(t, 0, addr)
	mallocWhenBack(t, c, 0)

	got := make([]byte, chunk)
	st.CopyFromDevice(got, ps[0])
	if err := st.Synchronize(); err != nil || !bytes.Equal(got, data[0]) {
		t.Fatalf("the evicted buffer after the restart: %v, equal %v", err, bytes.Equal(got, data[0]))
	}
	st.CopyFromDevice(got, ps[2])
	wantErr(t, st.Synchronize(), api.ErrUnavailable, addr+" restarted (boot ")
}
