package mediator_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/accelerator"
)

// While a node's address accepts connections and never answers, redialling
// it takes DialTimeout (10s); Status still answers within statusTimeout
// (5s), with an error for that node and the other node in full, and
// concurrent calls share one redial. Once the node is back, so is its
// status.
func TestStatusOfUnreachableNode(t *testing.T) {
	const bound = 7 * time.Second // statusTimeout and a margin
	s := startNodes(t, 2, 1, 64<<20, nil)
	addr := s.med.Status().Nodes[1].Addr
	s.nodes[1].Close()
	// This status finds the control connection lost, so the next ones redial.
	if ns := s.med.Status().Nodes[1]; ns.Error == "" {
		t.Fatalf("status of a stopped node has no error: %+v", ns)
	}
	hole := blackHole(t, addr)

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			start := time.Now()
			st := s.med.Status()
			if took := time.Since(start); took > bound {
				t.Errorf("status took %v with a node unreachable, want at most %v", took, bound)
			}
			if ns := st.Nodes[0]; ns.Error != "" || len(ns.Devices) != 1 {
				t.Errorf("status of the reachable node: %+v, want its device and no error", ns)
			}
			if e := st.Nodes[1].Error; !strings.Contains(e, addr) || !strings.Contains(e, "reconnecting") {
				t.Errorf("status of the unreachable node: error %q, want one naming %s and saying it is reconnecting", e, addr)
			}
		})
	}
	wg.Wait()
	if n := hole.accepted(); n != 1 {
		t.Fatalf("%d connections reached the unreachable node, want 1 redial shared by both status calls", n)
	}

	hole.close() // fails the redial in flight at once
	node, _, err := accelerator.StartSim(addr, 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	deadline := time.Now().Add(bound)
	for {
		ns := s.med.Status().Nodes[1]
		if ns.Error == "" && len(ns.Devices) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status did not recover once the node was back: %+v", ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Closing the mediator while a status query redials a node ends the redial
// and closes its connection rather than leaving it to the node.
func TestCloseDuringRedial(t *testing.T) {
	s := startNodes(t, 1, 1, 64<<20, nil)
	addr := s.med.Status().Nodes[0].Addr
	s.nodes[0].Close()
	if ns := s.med.Status().Nodes[0]; ns.Error == "" {
		t.Fatalf("status of a stopped node has no error: %+v", ns)
	}
	hole := blackHole(t, addr)
	// A status may still find the old connection open (the node's end of
	// it closing late on a loaded host) and fail on it without a redial:
	// then ask again, until one redials.
	var done chan struct{}
	status := func() {
		d := make(chan struct{})
		done = d
		go func() {
			defer close(d)
			s.med.Status()
		}()
	}
	status()
	deadline := time.Now().Add(5 * time.Second)
	for hole.accepted() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("status did not redial the node")
		}
		select {
		case <-done:
			if hole.accepted() == 0 {
				status()
			}
		case <-time.After(10 * time.Millisecond):
		}
	}
	s.med.Close()
	c := hole.conn(0)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	// Past the hello, the copy ends at EOF, or fails at the deadline.
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the redial's connection was not closed with the mediator: %v", err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("status still waits for a redial after the mediator closed")
	}
}

// hole is a listener that accepts connections and never answers them.
type hole struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func blackHole(t *testing.T, addr string) *hole {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hole{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.close)
	return h
}

func (h *hole) accepted() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

func (h *hole) conn(i int) net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[i]
}

// close stops listening and closes what it accepted.
func (h *hole) close() {
	h.l.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}
