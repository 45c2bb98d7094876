// Package systest starts a whole vgpu system in a test's process: a sim
// node and a mediator in front of it, listening on a Unix socket, all
// stopped when the test ends. It is test machinery: only tests import it
// (it is the one place besides cmd/ that imports the mediator).
package systest

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/mediator"
)

// Start starts a sim node of devs devices of size bytes each and a
// mediator in front of it, and returns the mediator's socket.
func Start(t testing.TB, devs int, size uint64) string {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	dir, err := os.MkdirTemp("", "vgpu-sys") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node, addr, err := accelerator.StartSim("127.0.0.1:0", devs, size, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	m, err := mediator.New(mediator.Config{Nodes: []string{addr.String()}, ContainerDir: filepath.Join(dir, "c"), StateDir: dir, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "m.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	t.Cleanup(func() { m.Close() })
	return socket
}
