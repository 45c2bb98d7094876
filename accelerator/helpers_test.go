package accelerator

// Shared test code: a sim node on loopback, a mediator-side client that
// speaks the node protocol over real TCP, and checks of typed errors.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

const (
	testDevices = 2
	testMemory  = 64 << 20 // per device
	testFrames  = testMemory / FrameSize
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l
}

// testNode is a sim node serving on loopback for one test.
type testNode struct {
	node *Node
	addr string
}

func startNode(t testing.TB) *testNode {
	t.Helper()
	return startSim(t, testDevices, testMemory)
}

// startSim is a sim node of devs devices of mem bytes each, on loopback.
func startSim(t testing.TB, devs int, mem uint64) *testNode {
	t.Helper()
	n, addr, err := StartSim("127.0.0.1:0", devs, mem, quietLog())
	if err != nil {
		t.Fatalf("StartSim: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return &testNode{node: n, addr: addr.String()}
}

// serveDevices is a node of devs, whose memory sizes are multiples of
// FrameSize, on loopback; it closes them with the node.
func serveDevices(t testing.TB, devs ...Device) *testNode {
	t.Helper()
	n, err := New("sim", devs, quietLog())
	if err != nil {
		for _, d := range devs {
			d.Close()
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go n.Serve(l)
	return &testNode{node: n, addr: l.Addr().String()}
}

// withRetention runs f on a node of its own that retains no freed sealed
// frames, then on one that does.
func withRetention(t *testing.T, f func(t *testing.T, tn *testNode)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("retain=%v", on), func(t *testing.T) {
			tn := startNode(t)
			tn.node.SetRetention(on)
			f(t, tn)
		})
	}
}

// wantOnlyRetained fails t unless every sealed frame of tn is one the node
// retains, and there are at most most of them (none on a node that retains
// none).
func wantOnlyRetained(t *testing.T, tn *testNode, most int) {
	t.Helper()
	if st := tn.node.ContentStats(); st.Sealed != st.Retained || st.Retained > most {
		t.Fatalf("content index %+v: want every sealed frame retained, at most %d", st, most)
	}
}

// race runs churn once and each of loops over and over, all at once, until
// churn returns or the loop fails, and fails t with every error.
func race(t *testing.T, churn func() error, loops ...func() error) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 1+len(loops))
	wg.Go(func() {
		defer close(done)
		if err := churn(); err != nil {
			errs <- err
		}
	})
	for _, loop := range loops {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := loop(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// dedupRound returns one round of c deduplicating want into the frames dst
// of dev: on a hit the first must hold all of want; then it writes them all
// (the first by a fill, the others by writes), which must not reach the
// frame they map. It counts the hits.
func dedupRound(c *client, dev uint32, dst []uint64, want []byte, hits *int) func() error {
	hashes := make([][32]byte, len(dst))
	for i := range hashes {
		hashes[i] = sha256.Sum256(want)
	}
	return func() error {
		hit, err := c.dedup(dev, dst, hashes...)
		if err != nil || !hit[0] {
			return err
		}
		*hits++
		if err := holdsFrame(c, dev, dst[0], want); err != nil {
			return fmt.Errorf("dedup hit %d: %w", *hits, err)
		}
		if err := c.fill(dev, 0, ext(dst[0], 0, FrameSize)); err != nil {
			return err
		}
		for _, f := range dst[1:] {
			if err := c.write(dev, []api.Extent{ext(f, 0, 4096)}, make([]byte, 4096)); err != nil {
				return err
			}
		}
		return nil
	}
}

// dialRaw opens a TCP connection to the node without saying anything.
func (tn *testNode) dialRaw(t testing.TB) *wire.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", tn.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", tn.addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return wire.NewConn(nc)
}

func mediatorHello(tenant string) *api.Hello {
	return &api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator, Tenant: tenant}
}

// client is one mediator connection to the node.
type client struct {
	t     testing.TB
	conn  *wire.Conn
	rpc   *wire.RPC
	hello api.HelloReply
}

// connect dials the node and says Hello as a mediator acting for tenant.
func (tn *testNode) connect(t testing.TB, tenant string) *client {
	t.Helper()
	conn := tn.dialRaw(t)
	rpc := wire.NewRPC(conn, "node "+tn.addr)
	t.Cleanup(func() { rpc.Close() })
	c := &client{t: t, conn: conn, rpc: rpc}
	body, err := rpc.Call(api.OpHello, nil, api.Encode(mediatorHello(tenant)))
	if err != nil {
		t.Fatalf("hello as %q: %v", tenant, err)
	}
	if err := api.Decode(body, &c.hello); err != nil {
		t.Fatalf("hello reply: %v", err)
	}
	return c
}

// call sends a request whose body is m (nil: empty) and returns the reply body.
func (c *client) call(op wire.Op, m api.Message) ([]byte, error) {
	if m == nil {
		return c.rpc.Call(op, nil)
	}
	return c.rpc.Call(op, nil, api.Encode(m))
}

func (c *client) tryAlloc(dev, n uint32) ([]uint64, error) {
	body, err := c.call(api.OpNodeAlloc, &api.NodeAlloc{Device: dev, Count: n})
	if err != nil {
		return nil, err
	}
	var r api.NodeFrames
	if err := api.Decode(body, &r); err != nil {
		return nil, err
	}
	if r.Device != dev || len(r.Frames) != int(n) {
		return nil, fmt.Errorf("alloc %d frames on device %d: got %d on device %d", n, dev, len(r.Frames), r.Device)
	}
	return r.Frames, nil
}

func (c *client) alloc(dev, n uint32) []uint64 {
	c.t.Helper()
	frames, err := c.tryAlloc(dev, n)
	if err != nil {
		c.t.Fatalf("alloc %d frames on device %d: %v", n, dev, err)
	}
	return frames
}

func (c *client) free(dev uint32, frames ...uint64) error {
	_, err := c.call(api.OpNodeFree, &api.NodeFrames{Device: dev, Frames: frames})
	return err
}

func (c *client) write(dev uint32, xs []api.Extent, p []byte) error {
	_, err := c.call(api.OpNodeWrite, &api.NodeAccess{Device: dev, Extents: xs, Payload: p})
	return err
}

func (c *client) read(dev uint32, xs ...api.Extent) ([]byte, error) {
	return c.call(api.OpNodeRead, &api.NodeAccess{Device: dev, Extents: xs})
}

func (c *client) fill(dev uint32, v byte, xs ...api.Extent) error {
	_, err := c.call(api.OpNodeFill, &api.NodeAccess{Device: dev, Extents: xs, Value: v})
	return err
}

func (c *client) copy(dev uint32, dst, src []api.Extent) error {
	_, err := c.call(api.OpNodeCopy, &api.NodeCopy{Device: dev, Dst: dst, Src: src})
	return err
}

func (c *client) launch(dev uint32, kernel string, args ...api.NodeArg) error {
	_, err := c.call(api.OpNodeLaunch, &api.NodeLaunch{Device: dev, Kernel: kernel, Args: args})
	return err
}

// cmd is one command of a batch.
func cmd(op wire.Op, m api.Message) api.Cmd { return api.Cmd{Op: op, Body: api.Encode(m)} }

func (c *client) batch(cmds ...api.Cmd) error {
	_, err := c.call(api.OpNodeBatch, &api.Batch{Cmds: cmds})
	return err
}

func (c *client) seal(dev uint32, frames ...uint64) error {
	_, err := c.call(api.OpNodeSeal, &api.NodeFrames{Device: dev, Frames: frames})
	return err
}

// dedup asks the node to fill each whole frame at dst[i] with contents of
// hash hashes[i], and returns which it filled.
func (c *client) dedup(dev uint32, dst []uint64, hashes ...[32]byte) ([]bool, error) {
	m := &api.NodeDedup{Device: dev, Hashes: hashes}
	for _, f := range dst {
		m.Dst = append(m.Dst, api.Extent{Addr: f, Len: FrameSize})
	}
	body, err := c.call(api.OpNodeDedup, m)
	if err != nil {
		return nil, err
	}
	var r api.NodeDedupReply
	if err := api.Decode(body, &r); err != nil {
		return nil, err
	}
	return r.Hit, nil
}

// mustWrite writes p at xs and reads it back.
func (c *client) mustWrite(dev uint32, xs []api.Extent, p []byte) {
	c.t.Helper()
	if err := c.write(dev, xs, p); err != nil {
		c.t.Fatalf("write %d bytes at %v: %v", len(p), xs, err)
	}
}

func (c *client) mustRead(dev uint32, xs ...api.Extent) []byte {
	c.t.Helper()
	b, err := c.read(dev, xs...)
	if err != nil {
		c.t.Fatalf("read %v: %v", xs, err)
	}
	if uint64(len(b)) != api.ExtentsLen(xs) {
		c.t.Fatalf("read %v: %d bytes, want %d", xs, len(b), api.ExtentsLen(xs))
	}
	return b
}

func (c *client) status() api.NodeStatus {
	c.t.Helper()
	body, err := c.call(api.OpNodeStatus, nil)
	if err != nil {
		c.t.Fatalf("status: %v", err)
	}
	var st api.NodeStatus
	if err := json.Unmarshal(body, &st); err != nil {
		c.t.Fatalf("status JSON %q: %v", body, err)
	}
	return st
}

// roundTrip proves the connection still works and is in step: a write and
// a read of the given frame, then a status call.
func (c *client) roundTrip(dev uint32, frame uint64) {
	c.t.Helper()
	p := []byte("still serving " + c.t.Name())
	x := []api.Extent{{Addr: frame + 100, Len: uint64(len(p))}}
	c.mustWrite(dev, x, p)
	if got := c.mustRead(dev, x...); string(got) != string(p) {
		c.t.Fatalf("read back %q, want %q", got, p)
	}
	c.status()
}

// used reports the bytes in use on each device, as the node itself sees it.
func (tn *testNode) used() [testDevices]uint64 {
	var u [testDevices]uint64
	for i, d := range tn.node.Status().Devices {
		u[i] = d.Used
	}
	return u
}

// waitUsed waits until the node's used bytes per device are want.
func (tn *testNode) waitUsed(t *testing.T, want [testDevices]uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for tn.used() != want {
		if time.Now().After(deadline) {
			t.Fatalf("used memory %v, want %v", tn.used(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// wantErr checks that err is a remote error of class sentinel whose message
// contains every part.
func wantErr(t *testing.T, err, sentinel error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", sentinel)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q (code %v), want %v", err, api.CodeOf(err), sentinel)
	}
	var re *api.RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("error %#v is not a *api.RemoteError", err)
	}
	for _, p := range parts {
		if !strings.Contains(re.Msg, p) {
			t.Errorf("error %q does not name %q", re.Msg, p)
		}
	}
}

// wantClosed checks that the node has closed conn, after at most one more
// frame (an error reply), which it returns decoded.
func wantClosed(t *testing.T, conn *wire.Conn) error {
	t.Helper()
	_ = conn.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
	var replyErr error
	h, err := conn.ReadHeader()
	if err == nil {
		body := make([]byte, h.Len)
		if err := conn.ReadBody(body); err != nil {
			t.Fatalf("reading reply body: %v", err)
		}
		if h.Flags != wire.FlagReply|wire.FlagError {
			t.Fatalf("got a %v reply with flags %#x, want an error", h.Op, h.Flags)
		}
		replyErr = wire.DecodeError(body)
		_, err = conn.ReadHeader()
	}
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open: %v", err)
	}
	return replyErr
}

// hex is how error messages name an address.
func hex(v uint64) string { return fmt.Sprintf("%#x", v) }

// ext is n bytes at offset off of frame.
func ext(frame, off, n uint64) api.Extent { return api.Extent{Addr: frame + off, Len: n} }

func bufArg(xs ...api.Extent) api.NodeArg { return api.NodeArg{Kind: api.ArgBuffer, Extents: xs} }
func i64Arg(v int64) api.NodeArg          { return api.NodeArg{Kind: api.ArgI64, Bits: uint64(v)} }
func f32Arg(v float32) api.NodeArg        { return api.NodeArg{Kind: api.ArgF32, Bits: api.F32Bits(v)} }

func f32Bytes(vs ...float32) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, vs)
	if err != nil {
		panic(err)
	}
	return b
}

func bytesF32(b []byte) []float32 {
	vs := make([]float32, len(b)/4)
	if _, err := binary.Decode(b, binary.LittleEndian, vs); err != nil {
		panic(err)
	}
	return vs
}

// pattern returns n bytes that depend on seed and position.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*7+i>>8)
	}
	return b
}

// raceWatch watches a node's content index through its test hook
// (contentIndex.hook): which frees have begun and not yet taken their
// frame, which reclaims have begun and not ended. A race test's callbacks
// see dedups about to copy or alias a frame, frees about to take one and
// reclaims about to take one, under the index's lock; a copy's callback
// may ask whether the free or reclaim the test is about is under way, and
// hold the copy until one begins (meet), so that the interleaving the test
// is about happens, not only may happen.
type raceWatch struct {
	mu sync.Mutex
	// frames being freed: begun, not yet retained or forgotten
	freeing map[frameRef]int
	// reclaims of a device begun and not ended
	reclaiming map[*device]int
	// dedups that began to copy or alias a frame since it was last freed
	copies map[frameRef]int
	// closed, and replaced, whenever a free or reclaim begins or a test
	// notes something (note)
	changed chan struct{}
	// called at hookCopy, hookFree and hookReclaim, where set, with the
	// index's lock held; set only by watchRaces's setup
	onCopy, onFree, onReclaim func(r frameRef)
}

// watchRaces installs a raceWatch, whose callbacks setup sets, on tn's
// content index until t ends.
func watchRaces(t *testing.T, tn *testNode, setup func(w *raceWatch)) *raceWatch {
	w := &raceWatch{freeing: map[frameRef]int{}, reclaiming: map[*device]int{}, copies: map[frameRef]int{}, changed: make(chan struct{})}
	setup(w)
	hook := func(p hookPoint, r frameRef) {
		var call func(frameRef)
		w.mu.Lock()
		switch p {
		case hookCopy:
			w.copies[r]++
			w.signal()
			call = w.onCopy
		case hookFreeBegin:
			w.freeing[r]++
			w.signal()
		case hookFree:
			if w.freeing[r]--; w.freeing[r] <= 0 {
				delete(w.freeing, r)
			}
			delete(w.copies, r)
			call = w.onFree
		case hookReclaimBegin:
			w.reclaiming[r.dev]++
			w.signal()
		case hookReclaim:
			call = w.onReclaim
		case hookReclaimEnd:
			w.reclaiming[r.dev]--
		}
		w.mu.Unlock()
		if call != nil {
			call(r)
		}
	}
	x := tn.node.content
	x.hook.Store(&hook)
	t.Cleanup(func() { x.hook.Store(nil) })
	return w
}

// signal wakes those awaiting something. The caller holds w.mu.
func (w *raceWatch) signal() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// freeBegun says whether a free of r has begun and not yet taken it.
func (w *raceWatch) freeBegun(r frameRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.freeing[r] > 0
}

// copied says whether a dedup has begun to copy or alias r since it was
// last freed.
func (w *raceWatch) copied(r frameRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.copies[r] > 0
}

// reclaimBegun says whether a reclaim of d's retained frames has begun and
// not ended.
func (w *raceWatch) reclaimBegun(d *device) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reclaiming[d] > 0
}

// await waits until cond holds, checked whenever a free or reclaim begins
// or a test notes something, for up to patience, and says whether it held.
func (w *raceWatch) await(cond func() bool, patience time.Duration) bool {
	deadline := time.After(patience)
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

// racePatience is how long a race test holds a dedup, under the index's
// lock, for the free or reclaim it is to meet: far longer than either
// takes to begin once its client has sent it.
const racePatience = 500 * time.Millisecond

// raceCount is how often a race test's interleaving happened, out of the
// chances it had; held counts those the test brought about by holding a
// dedup, missed those it held in vain. It is guarded by its raceWatch's mu.
type raceCount struct{ chances, met, held, missed int }

func (c raceCount) String() string {
	return fmt.Sprintf("met %d times in %d chances (%d by holding a dedup for it, %d holds in vain)", c.met, c.chances, c.held, c.missed)
}

// meet is a chance, counted in c, for a copy to meet what pending reports:
// it is met if pending holds now; else every other chance holds the copy
// until pending holds, up to racePatience. It says whether it was met.
func (w *raceWatch) meet(c *raceCount, pending func() bool) bool {
	w.mu.Lock()
	c.chances++
	hold := c.chances%2 == 1
	w.mu.Unlock()
	met := pending()
	hold = hold && !met
	if hold {
		met = w.await(pending, racePatience)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case hold && met:
		c.held++
		c.met++
	case hold:
		c.missed++
	case met:
		c.met++
	}
	return met
}

// count reads c, which w guards.
func (w *raceWatch) count(c *raceCount) raceCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *c
}

// note adds one to *n, which w guards, and wakes those awaiting it.
func (w *raceWatch) note(n *int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*n++
	w.signal()
}

// read reads n, which w guards.
func (w *raceWatch) read(n *int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *n
}
