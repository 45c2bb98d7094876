package mediator_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// startOversubscribed runs a node with one device of devMem bytes and a
// mediator whose host sessions may keep resident bytes on it and allocate
// factor times that.
func startOversubscribed(t testing.TB, devMem, resident uint64, factor float64, host uint64) *system {
	return startWith(t, devMem, func(c *mediator.Config) {
		c.TenantMemory, c.Oversubscribe, c.HostMemory = resident, factor, host
	})
}

// A tenant works on a buffer 1.5 times the device's memory: copies, memsets,
// device copies and kernels over windows of it all give exact results.
func TestBufferLargerThanTheDevice(t *testing.T) {
	const dev = 32 << 20
	s := startOversubscribed(t, dev, 0, 2, 8<<20) // evicts when the node is full; host RAM, then the spill file
	c := s.dial(t, "big", 1)
	const size = dev * 3 / 2
	big, err := c.Malloc(0, size)
	if err != nil {
		t.Fatalf("allocate 1.5x the device: %v", err)
	}
	data := randomBytes(5, size)
	st := c.Stream()
	st.CopyToDevice(big, data)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	// Kernels over windows: y[i] = 2*x[i] + y[i], with x the first window.
	const window = 4 << 20
	n := int64(window / 4)
	want := bytes.Clone(data)
	x := client.BytesFloat32(data[:window])
	for off := uint64(window); off+window <= size; off += 5 * window {
		st.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(big), client.Buf(big.Add(off)))
		y := client.BytesFloat32(want[off : off+window])
		for i := range y {
			y[i] = 2*x[i] + y[i]
		}
		copy(want[off:], client.Float32Bytes(y))
	}
	st.Memset(big.Add(size-100), 7, 100)
	copy(want[size-100:], bytes.Repeat([]byte{7}, 100))
	st.CopyDevice(big.Add(window), big.Add(size-2*window), window)
	copy(want[window:2*window], want[size-2*window:size-window])
	got := make([]byte, size)
	st.CopyFromDevice(got, big)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("byte %d differs: got %d, want %d", i, got[i], want[i])
	}
	status := s.med.Status()
	ts := status.Tenants[0]
	if status.HostSpilled == 0 {
		t.Fatalf("host RAM of 8 MiB held %d bytes and nothing spilled", status.HostRAM)
	}
	if ts.Evicted == 0 || ts.Resident > dev || ts.Resident+ts.Evicted < size {
		t.Fatalf("status: resident %d, evicted %d for a %d-byte buffer on a %d-byte device", ts.Resident, ts.Evicted, size, dev)
	}
	c.Close()
	s.waitIdle(t) // every frame and every evicted chunk released
	if st := s.med.Status(); st.HostRAM != 0 || st.HostSpilled != 0 {
		t.Fatalf("evicted memory left behind: %d bytes in RAM, %d spilled", st.HostRAM, st.HostSpilled)
	}
	victim(t, s.dial(t, "next", 1))
}

// With a resident cap, the virtual limit is cap × factor, exactly; a command
// whose buffers cannot all be resident at once fails alone.
func TestOversubscriptionLimits(t *testing.T) {
	s := startOversubscribed(t, 256<<20, 16<<20, 1.5, 64<<20)
	c := s.dial(t, "t", 1)
	a, err := c.Malloc(0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Malloc(0, 8<<20)
	if err != nil {
		t.Fatalf("allocation within 1.5x: %v", err)
	}
	_, err = c.Malloc(0, 4096)
	wantErr(t, err, api.ErrQuotaExceeded)
	st := c.Stream()
	st.CopyDevice(b, a, 8<<20) // a's first half and b fit: 16 MiB
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	st.Launch("saxpy", client.I64(4<<20), client.F32(1), client.Buf(a), client.Buf(b)) // 16 + 16 MiB resident at once
	wantErr(t, st.Synchronize(), api.ErrOutOfMemory)
	st.Memset(a, 1, 16<<20) // the session goes on
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	victim(t, s.dial(t, "other", 1))
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// startOversubscribedContainer runs a mediator whose tenant "over" may
// oversubscribe twice, in front of one node with devs devices, registers
// container c1 of it with a grant of grant bytes and devs devices, and
// returns the system and the container's socket.
func startOversubscribedContainer(t *testing.T, grant uint64, devs int) (*system, string) {
	t.Helper()
	quota := filepath.Join(t.TempDir(), "q.toml")
	if err := os.WriteFile(quota, []byte("[tenants.over]\nmemory = \"64MiB\"\noversubscribe = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startNodes(t, 1, devs, 256<<20, func(c *mediator.Config) { c.Quota, c.HostMemory = quota, 64<<20 })
	op, err := client.DialOperator(s.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	reply, err := op.Register(api.Register{Container: "c1", Tenant: "over", Memory: grant, Devices: uint32(devs), Pid: uint32(os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	return s, reply.Socket
}

// A container's sessions share its resident memory as processes share one
// GPU's: with a grant of 8 MiB oversubscribed twice, two sessions together
// keep at most 8 MiB on the device. When one needs frames the other holds,
// the other's coldest chunks are evicted for it; both read back what they
// wrote.
func TestContainerSessionsShareResidentMemory(t *testing.T) {
	const grant = 8 << 20
	s, socket := startOversubscribedContainer(t, grant, 1)
	dial := func() *client.Client {
		c, err := client.Dial(client.Options{Socket: socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	resident := func() (total uint64) {
		for _, ts := range s.med.Status().Tenants {
			if ts.Container == "c1" {
				total += ts.Resident
			}
		}
		return total
	}
	fill := func(c *client.Client, p client.Ptr, v byte) {
		t.Helper()
		st := c.Stream()
		st.Memset(p, v, grant)
		if err := st.Synchronize(); err != nil {
			t.Fatalf("fill with %d: %v", v, err)
		}
		if got := resident(); got > grant {
			t.Fatalf("the container's sessions keep %d bytes resident, its grant is %d", got, grant)
		}
	}
	check := func(c *client.Client, p client.Ptr, v byte) {
		t.Helper()
		got := make([]byte, grant)
		st := c.Stream()
		st.CopyFromDevice(got, p)
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, bytes.Repeat([]byte{v}, grant)); i >= 0 {
			t.Fatalf("byte %d reads %d, want %d", i, got[i], v)
		}
		if got := resident(); got > grant {
			t.Fatalf("the container's sessions keep %d bytes resident, its grant is %d", got, grant)
		}
	}
	a, b := dial(), dial()
	pa, err := a.Malloc(0, grant)
	if err != nil {
		t.Fatal(err)
	}
	fill(a, pa, 1)
	pb, err := b.Malloc(0, grant) // within grant × 2; it starts evicted
	if err != nil {
		t.Fatal(err)
	}
	fill(b, pb, 2)  // takes a's frames
	check(a, pa, 1) // and a takes them back
	check(b, pb, 2)
	// Together they allocate no more than the grant times the factor.
	_, err = a.Malloc(0, 1)
	wantErr(t, err, api.ErrQuotaExceeded)
}

// Three sessions of one container whose buffers together are 1.5 times its
// resident grant fill and read back their buffers at once: every read
// holds what its session last wrote, the container never keeps more than
// its grant resident, and a command that finds the others holding every
// frame fails alone with out-of-memory (run it with -race). The race must
// happen: some reads find their buffer evicted for another session since
// their fill. (That a command fails alone when the others are amid
// issuing, which happens here only by chance, is
// TestContainerSessionReclaimPassesOverBusySiblings.)
func TestContainerSessionsReclaimConcurrently(t *testing.T) {
	const grant, size, rounds = 8 << 20, 4 << 20, 15
	s, socket := startOversubscribedContainer(t, grant, 1)
	var wg sync.WaitGroup
	var oom, reclaimed atomic.Int64
	cs, ps := dialWithBuffers(t, socket, 3, size)
	for g, c := range cs {
		p := ps[g]
		wg.Go(func() {
			st := c.Stream()
			got := make([]byte, size)
			want := byte(0) // what the buffer holds: it starts zero
			for r := range rounds {
				v := byte(g*rounds + r + 1)
				st.Memset(p, v, size)
				if err := st.Synchronize(); errors.Is(err, api.ErrOutOfMemory) {
					oom.Add(1)
				} else if err != nil {
					t.Errorf("session %d, round %d: fill: %v", g, r, err)
					return
				} else {
					want = v
				}
				filled := mediator.SessionEvictions(s.med, c.Session())
				st.CopyFromDevice(got, p)
				if err := st.Synchronize(); errors.Is(err, api.ErrOutOfMemory) {
					oom.Add(1)
					continue
				} else if err != nil {
					t.Errorf("session %d, round %d: read: %v", g, r, err)
					return
				}
				if after := mediator.SessionEvictions(s.med, c.Session()); after > filled {
					reclaimed.Add(1)
				}
				if i := firstDiff(got, bytes.Repeat([]byte{want}, size)); i >= 0 {
					t.Errorf("session %d, round %d: byte %d reads %d, want %d", g, r, i, got[i], want)
					return
				}
			}
		})
	}
	wg.Wait()
	var resident uint64
	for _, ts := range s.med.Status().Tenants {
		if ts.Container == "c1" {
			resident += ts.Resident
		}
	}
	if resident > grant {
		t.Fatalf("the container's sessions keep %d bytes resident, its grant is %d", resident, grant)
	}
	t.Logf("%d of %d commands found every frame held; %d reads of %d found their buffer evicted since its fill", oom.Load(), 3*2*rounds, reclaimed.Load(), 3*rounds)
	if reclaimed.Load() == 0 {
		t.Errorf("the race never happened: no session's buffer was evicted for another between its fill and its read")
	}
}

// A command of one session that needs the frames its container's other
// sessions hold while they are amid issuing (the race that
// TestContainerSessionsReclaimConcurrently leaves to chance) does not wait
// for them, as they may be waiting for it: it fails alone with
// out-of-memory, and succeeds once they are done; they read back what
// they wrote.
func TestContainerSessionReclaimPassesOverBusySiblings(t *testing.T) {
	const grant, size = 8 << 20, 4 << 20
	s, socket := startOversubscribedContainer(t, grant, 1)
	cs, ps := dialWithBuffers(t, socket, 3, size)
	for i, c := range cs[1:] {
		st := c.Stream()
		st.Memset(ps[i+1], byte(i+1), size)
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	// Sessions 1 and 2 hold the whole grant, and are amid issuing.
	holds := []func(){mediator.HoldIssuing(s.med, cs[1].Session()), mediator.HoldIssuing(s.med, cs[2].Session())}
	st := cs[0].Stream()
	st.Memset(ps[0], 9, size)
	done := make(chan error, 1)
	go func() { done <- st.Synchronize() }()
	var err error
	waited := false
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		waited = true
	}
	for _, release := range holds {
		release()
	}
	if waited {
		t.Fatalf("a memset that needs the frames of sessions amid issuing waited 10s for them (then: %v)", <-done)
	}
	if !errors.Is(err, api.ErrOutOfMemory) {
		t.Fatalf("a memset that needs the frames of sessions amid issuing: %v, want out of memory", err)
	}
	st.Memset(ps[0], 9, size)
	if err := st.Synchronize(); err != nil {
		t.Fatalf("once the others were done: %v", err)
	}
	for i, c := range cs {
		want := bytes.Repeat([]byte{byte(i)}, size)
		if i == 0 {
			want = bytes.Repeat([]byte{9}, size)
		}
		got := make([]byte, size)
		st := c.Stream()
		st.CopyFromDevice(got, ps[i])
		if err := st.Synchronize(); err != nil {
			t.Fatalf("session %d: read: %v", i, err)
		}
		if j := firstDiff(got, want); j >= 0 {
			t.Fatalf("session %d: byte %d reads %d, want %d", i, j, got[j], want[j])
		}
	}
}

// dialWithBuffers opens n sessions on socket, each with a buffer of size
// bytes on device 0, closed when t ends.
func dialWithBuffers(t *testing.T, socket string, n int, size uint64) ([]*client.Client, []client.Ptr) {
	t.Helper()
	var cs []*client.Client
	var ps []client.Ptr
	for range n {
		c, err := client.Dial(client.Options{Socket: socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p, err := c.Malloc(0, size)
		if err != nil {
			t.Fatal(err)
		}
		cs, ps = append(cs, c), append(ps, p)
	}
	return cs, ps
}

// evictSealedWeight uploads weights (one chunk) and seals them, then, in a
// session with room for one chunk, memsets another chunk b to 3, which
// evicts the weight.
func evictSealedWeight(t *testing.T, c *client.Client, weights []byte) (w, b client.Ptr) {
	t.Helper()
	w, _ = upload(t, c, weights)
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}
	b, err := c.Malloc(0, frame)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Stream()
	st.Memset(b, 3, frame)
	if err := st.Synchronize(); err != nil {
		t.Fatalf("memset of a buffer that evicts a sealed weight: %v", err)
	}
	return w, b
}

// A sealed weight's frames are read-only on its node until they go back to
// it, so a fault-in that evicts the weight must not reuse its frame: with
// room for one chunk, memsetting a second buffer evicts the sealed weight
// and still succeeds, and the weight faults back in intact.
func TestFaultInAfterASealedWeight(t *testing.T) {
	s := startOversubscribed(t, 64<<20, frame, 2, 16<<20)
	c := s.dial(t, "t", 1)
	weights := randomBytes(11, frame)
	w, b := evictSealedWeight(t, c, weights)
	st := c.Stream()
	got := make([]byte, frame)
	st.CopyFromDevice(got, w)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, weights); i >= 0 {
		t.Fatalf("weight byte %d reads %d, want %d", i, got[i], weights[i])
	}
	st.CopyFromDevice(got, b)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, bytes.Repeat([]byte{3}, frame)); i >= 0 {
		t.Fatalf("byte %d of the memset buffer reads %d, want 3", i, got[i])
	}
}

// A sealed weight that a tenant's resident cap evicts goes back to the node,
// which retains it: faulting it back in, the node fills the frame from that
// copy and the weight's bytes do not cross the network again. On a node
// that retains nothing they do.
func TestEvictedWeightsComeBackFromTheNode(t *testing.T) {
	for _, retain := range []bool{true, false} {
		s := startOversubscribed(t, 64<<20, frame, 2, 16<<20)
		s.nodes[0].SetRetention(retain)
		c := s.dial(t, "t", 1)
		weights := randomBytes(12, frame)
		w, _ := evictSealedWeight(t, c, weights)
		st := c.Stream()
		before, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, frame)
		st.CopyFromDevice(got, w) // faults it back in
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, weights); i >= 0 {
			t.Fatalf("retain %v: weight byte %d reads %d, want %d", retain, i, got[i], weights[i])
		}
		after, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		sent, hits := after.NetOut-before.NetOut, after.DedupHits-before.DedupHits
		t.Logf("retain %v: faulting the weight back in sent %d bytes, %d pieces from the node", retain, sent, hits)
		switch {
		case retain && (hits != 1 || sent >= frame/2):
			t.Errorf("a weight the node retained sent %d bytes faulting back in, %d pieces from the node", sent, hits)
		case !retain && (hits != 0 || sent < frame):
			t.Errorf("a weight the node did not retain sent %d bytes faulting back in, %d pieces from the node", sent, hits)
		}
	}
}

// A weight sealed in a space with room for fewer chunks than it spans
// cannot have its frames resident together: it is sealed in the session
// (read-only), not on the node, rather than naming to the node frames that
// an eviction returned or gave to another chunk; it reads back intact.
func TestSealOfAWeightLargerThanTheResidentCap(t *testing.T) {
	s := startOversubscribed(t, 64<<20, 2*frame, 2, 16<<20)
	c := s.dial(t, "t", 1)
	const size = 3 * frame
	weights := randomBytes(12, size)
	w, err := c.MallocWith(0, size, client.AllocOptions{Hint: api.HintWeight})
	if err != nil {
		t.Fatal(err)
	}
	st := c.Stream()
	for off := uint64(0); off < size; off += frame {
		st.CopyToDevice(w.Add(off), weights[off:off+frame])
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(w); err != nil {
		t.Fatalf("seal a weight larger than the resident cap: %v", err)
	}
	st.Memset(w, 0, 4)
	wantErr(t, st.Synchronize(), api.ErrPermissionDenied)
	got := make([]byte, frame)
	for off := uint64(0); off < size; off += frame {
		st.CopyFromDevice(got, w.Add(off))
		if err := st.Synchronize(); err != nil {
			t.Fatalf("read %d bytes at offset %d of the weight: %v", frame, off, err)
		}
		if i := firstDiff(got, weights[off:off+frame]); i >= 0 {
			t.Fatalf("weight byte %d reads %d, want %d", off+uint64(i), got[i], weights[off+uint64(i)])
		}
	}
}

// A fault-in evicts what the resident cap requires before it asks for
// frames, so a container whose grant is held on one device can fault in on
// another: the grant counts the victims' frames only until they go back.
func TestContainerFaultInOnAnotherDevice(t *testing.T) {
	const grant = 2 * frame
	_, socket := startOversubscribedContainer(t, grant, 2)
	c, err := client.Dial(client.Options{Socket: socket, Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fill := func(dev int, size uint64, v byte) client.Ptr {
		t.Helper()
		p, err := c.Malloc(dev, size)
		if err != nil {
			t.Fatal(err)
		}
		st := c.Stream()
		st.Memset(p, v, size)
		if err := st.Synchronize(); err != nil {
			t.Fatalf("memset %d bytes on device %d: %v", size, dev, err)
		}
		return p
	}
	check := func(p client.Ptr, size uint64, v byte) {
		t.Helper()
		got := make([]byte, size)
		st := c.Stream()
		st.CopyFromDevice(got, p)
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, bytes.Repeat([]byte{v}, int(size))); i >= 0 {
			t.Fatalf("byte %d reads %d, want %d", i, got[i], v)
		}
	}
	a := fill(0, grant, 1)
	b := fill(1, frame, 2)
	check(a, grant, 1)
	check(b, frame, 2)
}
