package mediator

import (
	"bytes"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// inode is the filesystem inode of the socket at path.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A mediator that hands over with HandoverSockets leaves each container's
// socket bound at its path; the next one, given them as Config.Inherited,
// serves them — the same socket, not one bound again — once it has
// restored the sessions, so a tenant that connected in between is served
// and a restored session resumes with its bytes. A socket whose container
// is gone meanwhile is closed and removed.
func TestHandoverSocketsPassesContainerSockets(t *testing.T) {
	h := newHost(t)
	h.start()
	live, gone := sleeper(t), sleeper(t)
	sock := h.register(api.Register{Container: "live", Namespace: "moby", Memory: 16 << 20, Pid: uint32(live.Process.Pid)}).Socket
	goneSock := h.register(api.Register{Container: "gone", Namespace: "moby", Memory: 8 << 20, Pid: uint32(gone.Process.Pid)}).Socket
	c, err := client.Dial(client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Malloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(7, 1<<20)
	c.Stream().CopyToDevice(p, want)
	if err := c.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	bound := inode(t, sock)

	pass, err := h.med.HandoverSockets()
	if err != nil {
		t.Fatal(err)
	}
	h.med = nil
	if len(pass) != 2 || pass[sock] == nil || pass[goneSock] == nil {
		t.Fatalf("passed %v, want the sockets %s and %s", pass, sock, goneSock)
	}
	end(gone)
	// A tenant connecting now waits in the backlog: no process accepts.
	early := make(chan error, 1)
	go func() {
		c, err := client.Dial(client.Options{Socket: sock})
		if err == nil {
			_, err = c.Malloc(0, 4096)
			c.Close()
		}
		early <- err
	}()
	select {
	case err := <-early:
		t.Fatalf("a dial between the two mediators was answered (%v), with no mediator serving", err)
	case <-time.After(100 * time.Millisecond):
	}

	inherited := map[string]net.Listener{}
	for path, f := range pass {
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		inherited[path] = l
	}
	log := logrus.New()
	log.SetOutput(h.log)
	m, err := New(Config{Nodes: []string{h.node}, Quota: h.quota, ContainerDir: h.containerDir(), StateDir: h.stateDir(),
		ReclaimInterval: 50 * time.Millisecond, Log: log, Inherited: inherited})
	if err != nil {
		t.Fatal(err)
	}
	h.med = m
	t.Cleanup(func() { m.Close() })

	if err := <-early; err != nil {
		t.Fatalf("the dial made between the two mediators: %v", err)
	}
	got := make([]byte, len(want))
	c.Stream().CopyFromDevice(got, p)
	if err := c.Stream().Synchronize(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the handover: %v, bytes equal %v", err, bytes.Equal(got, want))
	}
	if now := inode(t, sock); now != bound {
		t.Fatalf("socket %s is inode %d after the handover, %d before: bound again, not passed", sock, now, bound)
	}
	if _, err := os.Lstat(goneSock); !os.IsNotExist(err) {
		t.Fatalf("the gone container's socket %s after the restore: %v, want it removed", goneSock, err)
	}
	if !strings.Contains(h.log.String(), "no registration's now") {
		t.Fatalf("the log does not say the gone container's passed socket was closed:\n%s", h.log)
	}
}
