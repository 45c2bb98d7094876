package mediator

import (
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/memory"
)

// startLimited is a mediator on one sim node, serving on a socket, with
// containers c1 and c2 of tenant t registered; it returns the mediator and
// the containers' sockets.
func startLimited(t *testing.T) (*Mediator, []string) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	n, addr, err := accelerator.StartSim("127.0.0.1:0", 1, 64<<20, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tmp, err := os.MkdirTemp("", "vgpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	quota := filepath.Join(tmp, "q.toml")
	if err := os.WriteFile(quota, []byte("[tenants.t]\nmemory = \"32MiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Nodes: []string{addr.String()}, Quota: quota, ContainerDir: filepath.Join(tmp, "c"), StateDir: tmp, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	sock := filepath.Join(tmp, "m.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	var sockets []string
	for _, id := range []string{"c1", "c2"} {
		r, err := m.Register(api.Register{Container: id, Tenant: "t", Memory: 8 << 20, Devices: 1, Pid: uint32(os.Getpid())})
		if err != nil {
			t.Fatal(err)
		}
		sockets = append(sockets, r.Socket)
	}
	return m, sockets
}

func dialAt(t *testing.T, socket string) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{Socket: socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Host regions cost the mediator address space: a container's sessions
// together, and all sessions of the mediator, map at most so many bytes;
// past either bound a registration fails with quota-exceeded naming it,
// and freeing a region, or ending its session, gives its bytes back.
func TestHostRegionsAreBounded(t *testing.T) {
	m, sockets := startLimited(t)
	const mib = 1 << 20
	m.mu.Lock()
	for _, c := range m.containers {
		c.hostMapped.limit = 8 * mib
	}
	m.mu.Unlock()
	m.hostMapped.limit = 12 * mib

	a1, a2 := dialAt(t, sockets[0]), dialAt(t, sockets[0])
	r1, err := a1.HostAlloc(4 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a2.HostAlloc(4 * mib); err != nil {
		t.Fatal(err)
	}
	_, err = a2.HostAlloc(mib)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "host regions of container c1") {
		t.Fatalf("past the container's bound: %v", err)
	}
	b := dialAt(t, sockets[1])
	if _, err := b.HostAlloc(4 * mib); err != nil {
		t.Fatal(err)
	}
	_, err = b.HostAlloc(mib)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "host regions of the mediator") {
		t.Fatalf("past the mediator's bound: %v", err)
	}
	if err := a1.HostFree(r1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.HostAlloc(4 * mib); err != nil {
		t.Fatalf("after a free: %v", err)
	}
	a2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for m.hostMapped.inUse() != 8*mib {
		if time.Now().After(deadline) {
			t.Fatalf("after a session ended the mediator counts %d bytes mapped, want %d", m.hostMapped.inUse(), 8*mib)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A container's socket serves at most MaxContainerConns connections at
// once; one more is answered with quota-exceeded naming the container, and
// the others are served on.
func TestContainerConnectionsAreBounded(t *testing.T) {
	_, sockets := startLimited(t)
	var held []net.Conn
	for range MaxContainerConns - 1 {
		nc, err := net.Dial("unix", sockets[0])
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, nc)
	}
	c := dialAt(t, sockets[0]) // the last one allowed
	_, err := client.Dial(client.Options{Socket: sockets[0]})
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "c1") {
		t.Fatalf("one connection too many: %v", err)
	}
	if _, err := c.Malloc(0, 4096); err != nil {
		t.Fatalf("a session of the container, at its bound: %v", err)
	}
	dialAt(t, sockets[1]) // another container is not affected
	held[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c2, err := client.Dial(client.Options{Socket: sockets[0]})
		if err == nil {
			c2.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a connection closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, nc := range held[1:] {
		nc.Close()
	}
}

// A tenant that connects to its container's socket in a loop, past
// MaxContainerConns, holds at most maxRefusing more of the mediator's
// descriptors, however many connections it opens: those past the bound are
// closed at once rather than kept waiting a second for a hello. Once the
// refused ones are gone, the next is answered with quota-exceeded again.
func TestRefusedConnectionsAreBounded(t *testing.T) {
	_, sockets := startLimited(t)
	dial := func() net.Conn {
		t.Helper()
		nc, err := net.Dial("unix", sockets[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	for range MaxContainerConns {
		dial() // silent: tracked, waiting for a hello
	}
	// The socket accepts in order: this one's answer says all of the
	// above are tracked.
	if _, err := client.Dial(client.Options{Socket: sockets[0]}); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("past the bound: %v", err)
	}
	base := openFDs(t)
	peak := make(chan int)
	stop := make(chan struct{})
	go func() {
		most := 0
		for {
			most = max(most, openFDs(t))
			select {
			case <-stop:
				peak <- most
				return
			default:
			}
		}
	}()
	const flood = 1000
	extra := make([]net.Conn, flood)
	for i := range extra {
		extra[i] = dial()
	}
	time.Sleep(300 * time.Millisecond) // well within the second a refusal may wait
	close(stop)
	// Each connection holds one descriptor here, on the tenant's side.
	if grown := <-peak - base; grown > flood+maxRefusing+32 {
		t.Fatalf("%d connections past the bound: %d more descriptors open in the process, want at most %d + %d (the mediator's)",
			flood, grown, flood, maxRefusing+32)
	}
	for _, nc := range extra {
		nc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := client.Dial(client.Options{Socket: sockets[0]})
		if errors.Is(err, api.ErrQuotaExceeded) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flood, a connection past the bound: %v, want quota exceeded", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Error(err)
	}
	return len(fds)
}

// A session has at most maxSessionInflight decoded commands in flight, and
// its tenant maxTenantInflight over all its sessions: past either the
// reader waits in admit (and so stops reading the tenant's socket) until
// answers give room back. A batch of the session's bound enters a session
// and tenant with nothing in flight.
func TestInflightCommandsAreBounded(t *testing.T) {
	tenant := &limiter{inflight: bound{limit: maxTenantInflight}}
	newSession := func() *session {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return &session{c: wire.NewConn(a), sessionFlow: sessionFlow{bw: tenant, inflight: bound{limit: maxSessionInflight}}}
	}
	admitted := func(s *session, n int64) <-chan error {
		done := make(chan error, 1)
		go func() { done <- s.admit(n) }()
		return done
	}
	waits := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("%s was admitted past its bound: %v", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	enters := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still waits after room was given back", what)
		}
	}

	a, b, c := newSession(), newSession(), newSession()
	enters(admitted(a, maxSessionInflight), "a batch of the session's bound")
	launch := admitted(a, 1)
	waits(launch, "a launch of a full session")
	a.answered(1)
	enters(launch, "the launch")

	// b fills the rest of the tenant's bound; c, with nothing in flight
	// itself, waits for the tenant.
	enters(admitted(b, maxTenantInflight-maxSessionInflight), "b's commands")
	other := admitted(c, 1)
	waits(other, "a launch of a tenant with all its room taken")
	b.answered(1)
	enters(other, "the other session's launch")
	if n := tenant.inflight.n.Load(); n != maxTenantInflight {
		t.Fatalf("tenant counts %d in flight, want %d", n, maxTenantInflight)
	}
	if n := a.inflight.n.Load(); n != maxSessionInflight {
		t.Fatalf("session counts %d in flight, want %d", n, maxSessionInflight)
	}
}

// A batch carries at most maxSessionInflight commands, as many as a session's
// queues hold: one more is refused with quota-exceeded naming its count and
// the bound, before its commands are decoded, and the session goes on.
// Graphs are bounded the same way.
func TestBatchesAreBounded(t *testing.T) {
	_, sockets := startLimited(t)
	nc, err := net.Dial("unix", sockets[0])
	if err != nil {
		t.Fatal(err)
	}
	r := wire.NewRPC(wire.NewConn(nc), "mediator")
	defer r.Close()
	if _, err := r.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant})); err != nil {
		t.Fatal(err)
	}
	body, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	var p api.MallocReply
	if err := api.Decode(body, &p); err != nil {
		t.Fatal(err)
	}
	batch := func(n int) *api.Batch {
		b := &api.Batch{Cmds: make([]api.Cmd, n)}
		memset := api.Encode(&api.Memset{Dst: p.Addr, Len: 1, Value: 1})
		for i := range b.Cmds {
			b.Cmds[i] = api.Cmd{Op: api.OpMemset, Body: memset}
		}
		return b
	}
	for _, op := range []wire.Op{api.OpBatch, api.OpGraphCreate} {
		_, err := r.Call(op, nil, api.Encode(batch(maxSessionInflight+1)))
		if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "16385 commands") || !strings.Contains(err.Error(), "16384") {
			t.Fatalf("%v of %d commands: %v, want quota exceeded naming both counts", op, maxSessionInflight+1, err)
		}
	}
	if _, err := r.Call(api.OpBatch, nil, api.Encode(batch(maxSessionInflight))); err != nil {
		t.Fatalf("batch of %d commands: %v", maxSessionInflight, err)
	}
	// A batch of graph launches counts the graphs' commands: three
	// launches of a graph of half the bound are refused, two enter.
	body, err = r.Call(api.OpGraphCreate, nil, api.Encode(batch(maxSessionInflight/2)))
	if err != nil {
		t.Fatal(err)
	}
	var g api.Graph
	if err := api.Decode(body, &g); err != nil {
		t.Fatal(err)
	}
	launches := func(n int) *api.Batch {
		b := &api.Batch{Cmds: make([]api.Cmd, n)}
		for i := range b.Cmds {
			b.Cmds[i] = api.Cmd{Op: api.OpGraphLaunch, Body: api.Encode(&api.GraphLaunch{Graph: g.Graph})}
		}
		return b
	}
	if _, err := r.Call(api.OpBatch, nil, api.Encode(launches(3))); !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "24576 commands") {
		t.Fatalf("batch of 3 launches of a graph of %d: %v, want quota exceeded naming 24576 commands", maxSessionInflight/2, err)
	}
	if _, err := r.Call(api.OpBatch, nil, api.Encode(launches(2))); err != nil {
		t.Fatalf("batch of 2 launches of a graph of %d: %v", maxSessionInflight/2, err)
	}
	if _, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: 4096})); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
}

// A container registered again while its previous registration is being
// released (its sessions tearing down, its quota not yet returned) waits
// for the release rather than fail as already admitted.
func TestRegisterWaitsForARelease(t *testing.T) {
	m, _ := startLimited(t)
	k := ctrKey{"", "c1"}
	// A release of c1 in progress, as releaseIf makes it: unregistered,
	// its quota still held.
	m.mu.Lock()
	ctr := m.containers[k]
	delete(m.containers, k)
	done := make(chan struct{})
	m.releasing[k] = done
	m.mu.Unlock()
	ctr.close()
	registered := make(chan error, 1)
	go func() {
		_, err := m.Register(api.Register{Container: "c1", Tenant: "t", Memory: 8 << 20, Devices: 1, Pid: uint32(os.Getpid())})
		registered <- err
	}()
	select {
	case err := <-registered:
		t.Fatalf("registered while the release was in progress: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	m.admission.Release(k.namespace, k.id)
	m.mu.Lock()
	delete(m.releasing, k)
	m.mu.Unlock()
	close(done)
	select {
	case err := <-registered:
		if err != nil {
			t.Fatalf("register once the release was done: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("register still waits after the release")
	}
}

// Bounds derived from huge grants saturate instead of wrapping to small
// ones: a grant of (nearly) 2^64 bytes, oversubscribed or not, bounds
// nothing below it.
func TestDerivedBoundsSaturate(t *testing.T) {
	const most = math.MaxUint64
	if got := virtual(1<<62, 16); got != most {
		t.Errorf("virtual(2^62, 16) = %d, want %d", got, uint64(most))
	}
	if got := virtual(1<<20, 1.5); got != 3<<19 {
		t.Errorf("virtual(1 MiB, 1.5) = %d", got)
	}
	for _, n := range []uint64{most, most - memory.FrameSize + 2, 1 << 63} {
		if got := frameBytes(fragmentedFrames(n)); got < n {
			t.Errorf("frames for %d bytes of allocations hold %d bytes", n, got)
		}
		if got := frameBytes(residentFrames(n, 1)); got < n {
			t.Errorf("resident bound of a %d-byte grant is %d bytes", n, got)
		}
	}
	if got := fragmentedFrames(memory.FrameSize + 1); got != 2*2+fragmentSlack {
		t.Errorf("fragmentedFrames(2 MiB + 1) = %d", got)
	}
}
