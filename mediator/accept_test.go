package mediator_test

import (
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// failingListener fails its first accepts as a process out of descriptors
// does, then accepts for real.
type failingListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// A socket whose accept fails for want of descriptors serves again once
// they are back: the mediator waits and retries rather than give it up.
func TestServeRetriesFailedAccepts(t *testing.T) {
	n, addr, err := accelerator.StartSim("127.0.0.1:0", 1, 64<<20, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tmp := t.TempDir()
	m, err := mediator.New(mediator.Config{Nodes: []string{addr.String()}, ContainerDir: filepath.Join(tmp, "c"), StateDir: tmp, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	sock := filepath.Join(tmp, "m.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l := &failingListener{Listener: ul}
	l.fails.Store(5)
	served := make(chan error, 1)
	go func() { served <- m.Serve(l) }()
	c, err := client.Dial(client.Options{Socket: sock, Tenant: "alpha"})
	if err != nil {
		t.Fatalf("dial after failed accepts: %v", err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 4096); err != nil {
		t.Fatalf("malloc: %v", err)
	}
	if l.fails.Load() >= 0 {
		t.Fatalf("the listener still had %d failures to give", l.fails.Load()+1)
	}
	m.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
}
