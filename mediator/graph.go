package mediator

import (
	"fmt"

	"github.com/vgpu/vgpu/api"
)

// Graphs: command sequences a tenant captured once (api.OpGraphCreate) and
// replays with one small command (api.OpGraphLaunch). A graph is decoded
// and checked when it is created; its commands are translated afresh at
// every replay, since memory may have moved. Its payloads are copied out
// of the request, whose buffer is reused.

// MaxGraphs bounds the graphs one session holds, and MaxGraphCommands
// their commands together: each decoded command takes some 300 bytes of
// the mediator's memory, where a launch on the wire may take 18.
const (
	MaxGraphs        = 256
	MaxGraphCommands = 1 << 14
)

func (s *session) createGraph(body []byte) (uint32, error) {
	_, cmds, err := s.decodeCommands(append([]byte(nil), body...), nil)
	if err != nil {
		return 0, fmt.Errorf("graph: %w", err)
	}
	for i := range cmds {
		if cmds[i].op == api.OpGraphLaunch {
			return 0, fmt.Errorf("graph: command %d launches another graph; graphs do not nest: %w", i, api.ErrInvalidArgument)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.graphs) >= MaxGraphs {
		return 0, fmt.Errorf("session has %d graphs, the limit: %w", len(s.graphs), api.ErrInvalidArgument)
	}
	if s.graphCmds+len(cmds) > MaxGraphCommands {
		return 0, fmt.Errorf("graph of %d commands: the session's graphs hold %d, and may hold %d in all: %w",
			len(cmds), s.graphCmds, MaxGraphCommands, api.ErrQuotaExceeded)
	}
	s.graphCmds += len(cmds)
	id := s.nextGraph + 1
	for s.graphs[id] != nil || id == 0 { // ids wrap; never replace a live graph
		id++
	}
	s.nextGraph = id
	s.graphs[id] = cmds
	return id, nil
}

func (s *session) destroyGraph(body []byte) error {
	var m api.Graph
	if err := api.Decode(body, &m); err != nil {
		return err
	}
	s.drainAll() // replays already queued still run it
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.graphs[m.Graph] == nil {
		return fmt.Errorf("graph %d does not exist: %w", m.Graph, api.ErrInvalidArgument)
	}
	s.graphCmds -= len(s.graphs[m.Graph])
	delete(s.graphs, m.Graph)
	return nil
}

// graph returns a graph's commands, for a replay; they are never changed.
func (s *session) graph(id uint32) ([]command, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmds := s.graphs[id]
	if cmds == nil {
		return nil, fmt.Errorf("graph %d does not exist: %w", id, api.ErrInvalidArgument)
	}
	return cmds, nil
}
