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
	_, socket := StartWith(t, Options{Devices: devs, Size: size})
	return socket
}

// Options describe a system of StartWith.
type Options struct {
	Devices int    // of the sim node
	Size    uint64 // of each device, in bytes
	// Serve, when set, are the node's devices instead of sim's (Devices
	// and Size unused), of the backend Backend names: the node closes
	// them.
	Serve   []accelerator.Device
	Backend string
	// Quota is the text of the mediator's quota file; "": none.
	Quota string
	// Dir holds the socket (m.sock), the quota file and the containers'
	// socket directories (c/); "": a temporary directory, removed at the
	// end. A test that starts a mediator again on the same socket passes
	// the same Dir, after closing the first.
	Dir string
}

// StartWith starts a sim node and a mediator as o says, and returns the
// mediator (a test may Close it early) and its socket.
func StartWith(t testing.TB, o Options) (*mediator.Mediator, string) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "vgpu-sys"); err != nil { // short: socket paths are limited to 108 bytes
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	var node *accelerator.Node
	var addr net.Addr
	var err error
	if o.Serve != nil {
		node, addr, err = accelerator.StartWith("127.0.0.1:0", o.Backend, o.Serve, accelerator.SimOptions{}, log)
	} else {
		node, addr, err = accelerator.StartSim("127.0.0.1:0", o.Devices, o.Size, log)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	cfg := mediator.Config{Nodes: []string{addr.String()}, ContainerDir: filepath.Join(dir, "c"), StateDir: dir, Log: log}
	if o.Quota != "" {
		cfg.Quota = filepath.Join(dir, "quota.toml")
		if err := os.WriteFile(cfg.Quota, []byte(o.Quota), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := mediator.New(cfg)
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
	return m, socket
}
