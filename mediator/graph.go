package mediator

import (
	"fmt"

	"github.com/vgpu/vgpu/api"
)

// Graphs: command sequences a tenant captured once (api.OpGraphCreate) and
// replays with one small command (api.OpGraphLaunch). A graph is decoded
// and checked when it is created; its commands are translated afresh at
// every replay, since memory may have moved.
//
// Invariant: a graph's memory is bounded by its commands. It holds no copy
// payloads (an inline copy is refused: a graph's copies name host memory,
// read at replay time), and its launches name catalog kernels with their
// number of arguments, so no command keeps more than a catalog entry's
// worth of name and arguments. So nothing of a graph refers to the
// request, whose buffer is reused.

// MaxGraphs bounds the graphs one session holds, and MaxGraphCommands
// their commands together: each decoded command takes some 300 bytes of
// the mediator's memory, where a launch on the wire may take 18.
const (
	MaxGraphs        = 256
	MaxGraphCommands = 1 << 14
)

func (s *session) createGraph(body []byte) (uint32, error) {
	_, cmds, err := s.decodeCommands(body, nil)
	if err != nil {
		return 0, fmt.Errorf("graph: %w", err)
	}
	for i := range cmds {
		if err := s.checkGraphCommand(&cmds[i]); err != nil {
			return 0, fmt.Errorf("graph: command %d: %w", i, err)
		}
	}
	return s.graphs.add(cmds)
}

// checkGraphCommand refuses a command a graph may not keep (see the
// invariant above). A launch's kinds and buffers are checked at replay,
// with every launch's.
func (s *session) checkGraphCommand(c *command) error {
	switch c.op {
	case api.OpGraphLaunch:
		return fmt.Errorf("it launches another graph; graphs do not nest: %w", api.ErrInvalidArgument)
	case api.OpCopyToDevice:
		return fmt.Errorf("%v of %d bytes to %#x carries its bytes, which a graph would keep: copy from host memory (%v) instead: %w",
			c.op, len(c.toDev.Payload), c.toDev.Dst, api.OpCopyToDeviceHost, api.ErrInvalidArgument)
	case api.OpLaunch:
		_, err := s.m.kernel(&c.launch)
		return err
	}
	return nil
}

func (s *session) destroyGraph(body []byte) error {
	var m api.Graph
	if err := api.Decode(body, &m); err != nil {
		return err
	}
	s.drainAll() // replays already queued still run it
	return s.graphs.remove(m.Graph)
}
