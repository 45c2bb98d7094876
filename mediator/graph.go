package mediator

import (
	"fmt"
	"slices"

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
// request, whose buffer is reused: the session's journal takes a copy of
// it, which a restarted mediator decodes and checks again (resume.go).

// MaxGraphs bounds the graphs one session holds, and MaxGraphCommands
// their commands together: each decoded command takes some 300 bytes of
// the mediator's memory, where a launch on the wire may take 18.
const (
	MaxGraphs        = 256
	MaxGraphCommands = 1 << 14
)

// createGraph creates a graph as body asks, and journals it (journal.go):
// its request, which a restore decodes and checks again — unless it
// copies host memory, whose regions a restart loses (resume.go): then the
// journal says only that the graph was, so that its id is not reused.
func (s *session) createGraph(body []byte) (uint32, error) {
	cmds, err := s.graphCommands(body)
	if err != nil {
		return 0, err
	}
	id, err := s.graphs.add(cmds)
	if err != nil {
		return 0, err
	}
	rec := journalOp{Op: opGraph, Graph: id, Body: body}
	if copiesHost(cmds) {
		rec.Body = nil
	}
	s.jr.add(rec)
	return id, nil
}

// graphCommands decodes and checks a graph's commands.
func (s *session) graphCommands(body []byte) ([]command, error) {
	_, decoded, err := s.decodeCommands(body, nil)
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	// The graph keeps a list of its own length, not a batch's recycled
	// room, which may hold thousands of commands: a graph's memory is
	// bounded by its commands' count (MaxGraphCommands).
	cmds := slices.Clone(decoded)
	giveCommands(decoded)
	for i := range cmds {
		if err := s.checkGraphCommand(&cmds[i]); err != nil {
			return nil, fmt.Errorf("graph: command %d: %w", i, err)
		}
	}
	return cmds, nil
}

// copiesHost says whether cmds copy to or from host regions.
func copiesHost(cmds []command) bool {
	for _, c := range cmds {
		if c.op == api.OpCopyToDeviceHost || c.op == api.OpCopyFromDeviceHost {
			return true
		}
	}
	return false
}

// replayGraph recreates graph op.Graph of a session being restored as its
// journal record op says (resume.go).
func (s *session) replayGraph(op journalOp) error {
	if op.Body == nil {
		s.graphs.lose(op.Graph, fmt.Errorf("graph %d copies host memory, whose registrations a mediator restart lost: destroy it and create it again: %w", op.Graph, api.ErrUnavailable))
		return nil
	}
	cmds, err := s.graphCommands(op.Body)
	if err != nil {
		return err
	}
	return s.graphs.addAs(op.Graph, cmds)
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
	if err := s.graphs.remove(m.Graph); err != nil {
		return err
	}
	s.jr.add(journalOp{Op: opUngraph, Graph: m.Graph})
	return nil
}
