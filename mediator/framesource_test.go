package mediator

import (
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/memory"
)

// A node that answers a grant with a frame twice, a misaligned frame, a
// frame the session holds already, or too few frames is refused: the
// frames it certainly granted go back to it, and the container's count of
// resident memory holds exactly the frames the space holds, all along and
// after the space closes.
func TestFrameSourceRefusesBadGrants(t *testing.T) {
	const f = memory.FrameSize
	for _, tc := range []struct {
		name   string
		answer []uint64 // to the grant of 2 frames that follows one of frame 0
		back   []uint64 // what the node must get back from that answer
	}{
		{"a frame twice", []uint64{f, f}, []uint64{f}},
		{"a misaligned frame", []uint64{f, 2*f + 4096}, []uint64{f}},
		{"a frame held already", []uint64{0, f}, []uint64{f}},
		{"too few frames", []uint64{f}, []uint64{f}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gn := &grantNode{answers: [][]uint64{{0}, tc.answer}}
			addr := gn.serve(t)
			rpc, _, err := dialNode(addr, nodeTenant{name: "t"}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rpc.Close()
			s := &session{m: &Mediator{nodes: []*node{{addr: addr}}}, vdevs: []vdev{{dev: &device{}, rpc: rpc}}}
			s.ctr = &container{resident: &budget{owner: "container", limit: 8 * f}}
			sp := memory.NewSpace(newFrameSource(s), 0)
			if _, err := sp.Alloc(0, f); err != nil {
				t.Fatal(err)
			}
			_, err = sp.Alloc(0, 2*f)
			if !errors.Is(err, api.ErrProtocol) && !errors.Is(err, api.ErrInternal) {
				t.Fatalf("alloc granted %v: %v, want a broken contract", tc.answer, err)
			}
			if got := gn.returned(); !slices.Equal(got, tc.back) {
				t.Errorf("node got back %v, want %v", got, tc.back)
			}
			if used := s.ctr.resident.inUse(); used != f {
				t.Errorf("the container counts %d bytes resident, the space holds %d", used, uint64(f))
			}
			if err := sp.Close(); err != nil {
				t.Fatal(err)
			}
			if used := s.ctr.resident.inUse(); used != 0 {
				t.Errorf("after close the container counts %d bytes resident", used)
			}
		})
	}
}

// grantNode is a node that answers the session's grants from answers, in
// turn, and records the frames it is given back.
type grantNode struct {
	answers [][]uint64

	mu   sync.Mutex
	back []uint64
}

func (n *grantNode) returned() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.back)
}

// serve answers one mediator connection on loopback until it closes.
func (n *grantNode) serve(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		c := wire.NewConn(nc)
		for {
			h, err := c.ReadHeader()
			if err != nil {
				return
			}
			body, err := io.ReadAll(c.BodyReader(int(h.Len)))
			if err != nil {
				return
			}
			var reply []byte
			switch h.Op {
			case api.OpHello:
				reply = api.Encode(&api.HelloReply{Version: api.Version, Session: 1})
			case api.OpNodeAlloc:
				reply = api.Encode(&api.NodeFrames{Frames: n.answers[0]})
				n.answers = n.answers[1:]
			case api.OpNodeFree:
				var m api.NodeFrames
				if err := api.Decode(body, &m); err != nil {
					return
				}
				n.mu.Lock()
				n.back = append(n.back, m.Frames...)
				n.mu.Unlock()
			}
			if c.Reply(h, reply) != nil {
				return
			}
		}
	}()
	return l.Addr().String()
}
