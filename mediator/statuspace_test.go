package mediator

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// unprivilegedOperator connects to m's host socket as a local user other
// than root and the mediator's: over a pipe, which carries no peer
// credentials, so its peer is not privileged (privileged).
func unprivilegedOperator(t *testing.T, m *Mediator) *wire.RPC {
	t.Helper()
	mine, theirs := net.Pipe()
	go m.serveConn(theirs, nil, func() {})
	r := wire.NewRPC(wire.NewConn(mine), "mediator")
	t.Cleanup(func() { r.Close() })
	if _, err := r.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator})); err != nil {
		t.Fatal(err)
	}
	return r
}

// Anyone who reaches the host socket may read the status and tenants, and
// every answer asks every node for its status, and etcd in cluster mode:
// an unprivileged peer's status and tenants requests are spaced
// SelfInterval apart over all its connections, while an operator's (root
// or the mediator's user: vgpuctl, the status page) are not. Unpaced, 8
// connections of one peer had the node answer 11 865 status requests in a
// second.
func TestUnprivilegedStatusPaced(t *testing.T) {
	h := newHost(t)
	h.start()
	sock := h.serveHost()
	const conns, each = 4, 3
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		r := unprivilegedOperator(t, h.med)
		wg.Go(func() {
			for i := range each {
				op := api.OpStatus // asks the nodes (and etcd in cluster mode)
				if i%2 == 1 {
					op = api.OpTenants // asks etcd in cluster mode
				}
				if _, err := r.Call(op, nil); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if took, want := time.Since(start), (conns*each-1)*SelfInterval; took < want {
		t.Errorf("%d status and tenants requests of an unprivileged peer over %d connections answered in %v, want at least %v (%v apart)", conns*each, conns, took, want, SelfInterval)
	}
	op, err := client.DialOperator(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	start = time.Now()
	for range conns * each {
		if _, err := op.Status(); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took >= 2*SelfInterval {
		t.Errorf("%d status requests of the mediator's own user took %v: an operator is not paced", conns*each, took)
	}
}

// A mediator that closes (a stop, a handover) does not wait for the paced
// requests queued — a container's views, an unprivileged peer's status:
// they fail at once as unavailable. Left to their turns, the requests
// queued here held Close for 0.8 s rather than 1 ms, and a container's 64
// connections could hold it 6 s, a uid's MaxHostConnsPerUID 25 s.
func TestCloseCutsPacedRequests(t *testing.T) {
	h := newHost(t)
	h.start()
	ctr := h.register(api.Register{Container: "c", Namespace: "moby", Memory: 8 << 20})
	const conns, each = 8, 4
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns*each)
	ask := func(call func() error) {
		wg.Go(func() {
			for range each {
				err := call()
				errs <- err
				if err != nil {
					return
				}
			}
		})
	}
	for range conns {
		view, err := client.DialOperator(ctr.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer view.Close()
		ask(func() error { _, err := view.Self(); return err })

		r := unprivilegedOperator(t, h.med)
		ask(func() error { _, err := r.Call(api.OpStatus, nil); return err })
	}
	time.Sleep(2 * SelfInterval)
	start := time.Now()
	h.stop()
	if took := time.Since(start); took > 300*time.Millisecond {
		t.Errorf("Close took %v with paced requests queued", took)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatalf("the paced requests still wait %v after Close", time.Since(start))
	}
	close(errs)
	unavailable := 0
	for err := range errs {
		if errors.Is(err, api.ErrUnavailable) {
			unavailable++
		}
	}
	if unavailable == 0 {
		t.Fatal("no paced request was cut short as unavailable")
	}
}
