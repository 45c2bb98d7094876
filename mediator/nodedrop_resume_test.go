package mediator

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// A session whose node connection dropped and was reclaimed keeps a valid
// journal: a mediator crash after it restores every allocation, those made
// before the drop and after it, with their bytes.
func TestReclaimedSessionSurvivesACrash(t *testing.T) {
	h := newHost(t)
	h.start()
	c := h.dial(h.serveHost())
	s := c.Stream()
	sizes := []int{3 << 20, 40 << 10, 2 << 20}
	var ptrs []client.Ptr
	write := func(i int) {
		t.Helper()
		p, err := c.Malloc(0, uint64(sizes[i]))
		if err != nil {
			t.Fatal(err)
		}
		s.CopyToDevice(p, pattern(byte(i), sizes[i]))
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		ptrs = append(ptrs, p)
	}
	write(0)
	write(1)

	// Drop the session's node connection; the node stays up.
	h.med.mu.Lock()
	sess := h.med.sessions[c.Session()]
	h.med.mu.Unlock()
	sess.nodes.mu.Lock()
	sess.vdevs[0].rpc.Close()
	sess.nodes.mu.Unlock()
	read := func(i int) error {
		got := make([]byte, sizes[i])
		s.CopyFromDevice(got, ptrs[i])
		if err := s.Synchronize(); err != nil {
			return err
		}
		if !bytes.Equal(got, pattern(byte(i), sizes[i])) {
			t.Fatalf("allocation %d differs", i)
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for err := read(0); err != nil; err = read(0) {
		if !errors.Is(err, api.ErrUnavailable) || strings.Contains(err.Error(), "went with it") || time.Now().After(deadline) {
			t.Fatalf("read after the drop: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := sess.nodes.reclaimed.Load(); n != 1 {
		t.Fatalf("%d node connections reclaimed, want 1", n)
	}
	write(2)

	h.crash()
	if out := h.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("restart log does not restore the session:\n%s", out)
	}
	h.serveHost()
	for i := range ptrs {
		if err := read(i); err != nil {
			t.Fatalf("allocation %d after the restart: %v", i, err)
		}
	}
}
