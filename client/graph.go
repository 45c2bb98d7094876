package client

import (
	"fmt"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Capture and replay: a stream records the commands called between
// BeginCapture and EndCapture instead of running them; the mediator keeps
// the recording as a graph, and Replay runs it with one small command.
// Copies in a graph must use memory of HostAlloc: a replay reads and writes
// that memory as it is at replay time, like a CUDA graph's copy nodes.

// Graph is a recorded command sequence held by the mediator.
type Graph struct {
	c  *Client
	id uint32
}

type capture struct {
	body []byte
	n    int
	err  error
}

func (cp *capture) add(op wire.Op, m api.Message) {
	cp.body = api.AppendCmd(cp.body, op, m)
	cp.n++
}

func (cp *capture) fail(err error) {
	if cp.err == nil {
		cp.err = err
	}
}

// BeginCapture starts recording the stream's commands: until EndCapture
// they are kept, not run.
func (s *Stream) BeginCapture() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture != nil {
		return fmt.Errorf("stream %d is capturing already: %w", s.id, api.ErrInvalidArgument)
	}
	s.flush()
	s.capture = &capture{}
	return nil
}

// EndCapture stops recording and hands the recording to the mediator,
// which checks every command of it now.
func (s *Stream) EndCapture() (*Graph, error) {
	s.mu.Lock()
	cp := s.capture
	s.capture = nil
	s.mu.Unlock()
	if cp == nil {
		return nil, fmt.Errorf("stream %d is not capturing: %w", s.id, api.ErrInvalidArgument)
	}
	if cp.err != nil {
		return nil, cp.err
	}
	var hdr wire.Encoder
	hdr.U32(s.id)
	hdr.U32(uint32(cp.n))
	body, err := s.c.rpc.Call(api.OpGraphCreate, nil, hdr.B, cp.body)
	var g api.Graph
	if err == nil {
		err = api.Decode(body, &g)
	}
	if err != nil {
		return nil, fmt.Errorf("graph of %d commands: %w", cp.n, err)
	}
	return &Graph{c: s.c, id: g.Graph}, nil
}

// Replay queues the graph's commands on s.
func (s *Stream) Replay(g *Graph) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(api.OpGraphLaunch, &api.GraphLaunch{Stream: s.id, Graph: g.id})
}

// Destroy releases the graph once work already queued is done.
func (g *Graph) Destroy() error {
	g.c.flushAll()
	_, err := g.c.rpc.Call(api.OpGraphDestroy, nil, api.Encode(&api.Graph{Graph: g.id}))
	return err
}
