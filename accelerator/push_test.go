package accelerator

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Pushes to a peer that reads none never block whoever pushes: they wait
// in the connection's queue, and the push that finds MaxPushBacklog
// waiting ends the connection rather than be dropped from one that stays
// open.
func TestPushesToAPeerThatDoesNotReadEndItsConnection(t *testing.T) {
	nc, peer := net.Pipe() // a write waits until the peer reads it
	defer peer.Close()
	p := startPusher(wire.NewConn(nc), quietLog())
	defer p.stop()
	body := api.Encode(&api.NodeInval{Object: 1, Page: 2, Version: 3})
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		// One in the pusher's hands, MaxPushBacklog queued, one too many.
		for range MaxPushBacklog + 2 {
			p.push(api.OpNodeInval, body)
		}
	}()
	select {
	case <-pushed:
	case <-time.After(5 * time.Second):
		t.Fatalf("%d pushes to a peer that reads none still block after 5s", MaxPushBacklog+2)
	}
	// The peer finds the connection ended, after the pushes, if any, that
	// it reads before the close.
	pc := wire.NewConn(peer)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	for n := 0; ; n++ {
		h, err := pc.ReadHeader()
		if err == nil && h.Op == api.OpNodeInval && h.Flags == wire.FlagPush {
			err = pc.ReadBody(make([]byte, h.Len))
		} else if err == nil {
			t.Fatalf("push %d: %v with flags %#x, want an invalidation", n, h.Op, h.Flags)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return
		}
		if err != nil {
			t.Fatalf("after %d pushes: %v; want the connection ended", n, err)
		}
	}
}

// Pushes to a peer that reads them arrive in the order they were pushed,
// all of them, even a burst as large as the queue takes at once.
func TestPushesArriveInOrder(t *testing.T) {
	nc, peer := net.Pipe()
	defer peer.Close()
	p := startPusher(wire.NewConn(nc), quietLog())
	defer p.stop()
	const n = MaxPushBacklog
	go func() {
		for v := range uint64(n) {
			p.push(api.OpNodeInval, api.Encode(&api.NodeInval{Object: 1, Version: v}))
		}
	}()
	pc := wire.NewConn(peer)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	for v := range uint64(n) {
		h, err := pc.ReadHeader()
		body := make([]byte, h.Len)
		if err == nil {
			err = pc.ReadBody(body)
		}
		var m api.NodeInval
		if err == nil {
			err = api.Decode(body, &m)
		}
		if err != nil {
			t.Fatalf("push %d: %v", v, err)
		}
		if m.Version != v {
			t.Fatalf("push %d carries version %d", v, m.Version)
		}
	}
}
