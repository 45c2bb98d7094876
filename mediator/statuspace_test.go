package mediator

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Anyone who reaches the host socket may read the status, and every answer
// asks every node for its status: an unprivileged peer's status requests
// are spaced SelfInterval apart over all its connections, while an
// operator's (root or the mediator's user: vgpuctl, the status page) are
// not. Unpaced, 8 connections of one peer had the node answer 11 865
// status requests in a second.
func TestUnprivilegedStatusPaced(t *testing.T) {
	h := newHost(t)
	h.start()
	sock := h.serveHost()
	const conns, each = 4, 3
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		// A pipe carries no peer credentials: its peer is not privileged
		// (privileged), as a local user other than root and the
		// mediator's is not.
		mine, theirs := net.Pipe()
		go h.med.serveConn(theirs, nil, func() {})
		r := api.NewRPC(api.NewConn(mine), "mediator")
		defer r.Close()
		if _, err := r.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator})); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range each {
				if _, err := r.Call(api.OpStatus, nil); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if took, want := time.Since(start), (conns*each-1)*SelfInterval; took < want {
		t.Errorf("%d status requests of an unprivileged peer over %d connections answered in %v, want at least %v (%v apart)", conns*each, conns, took, want, SelfInterval)
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
