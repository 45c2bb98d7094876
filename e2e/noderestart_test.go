package e2e

import (
	"bytes"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/daemon"
)

// A vgpu-node killed with SIGKILL and started again on its address comes
// back empty; the session of a tenant with a device on it and one on
// another node goes on: a plain buffer there fails with unavailable naming
// the node, a sealed weight the other node also holds reads back intact
// (vgpu-mediator --weight-sums) without the tenant sending it again, and a
// new buffer on the restarted node works.
func TestNodeKilledAndRestarted(t *testing.T) {
	addrA, addrB := freePort(t), freePort(t)
	nodeA := startNodeAt(t, addrA, "--memory", "256MiB")
	startNodeAt(t, addrB, "--memory", "256MiB")
	dir := t.TempDir()
	socket := filepath.Join(dir, "mediator.sock")
	startProc(t, "vgpu-mediator", "--socket", socket, "--node", addrA, "--node", addrB, "--state-dir", dir,
		"--quota", "", "--containerd", "", "--log-level", "warn", "--weight-sums")
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })

	c, err := client.Dial(client.Options{Socket: socket, Tenant: "a", Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	onA := 0
	if c.Devices()[1].Node == addrA {
		onA = 1
	}
	onB := 1 - onA
	const size = 4 << 20
	w := make([]byte, size)
	rand.Read(w)
	st := c.Stream()
	put := func(dev int, data []byte, hint api.Hint) client.Ptr {
		t.Helper()
		p, err := c.MallocWith(dev, uint64(len(data)), client.AllocOptions{Hint: hint})
		if err != nil {
			t.Fatal(err)
		}
		st.CopyToDevice(p, data)
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := c.Seal(put(onB, w, api.HintWeight)); err != nil { // the other node's copy
		t.Fatal(err)
	}
	weightA := put(onA, w, api.HintWeight)
	if err := c.Seal(weightA); err != nil {
		t.Fatal(err)
	}
	plain := put(onA, w[:4096], api.HintNone)
	before, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}

	if err := nodeA.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	nodeA.cmd.Wait()
	startNodeAt(t, addrA, "--memory", "256MiB")

	deadline := time.Now().Add(15 * time.Second)
	for {
		p, err := c.Malloc(onA, 4096)
		if err == nil {
			if err := c.Free(p); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("malloc on the restarted node: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := make([]byte, size)
	st.CopyFromDevice(got, weightA)
	if err := st.Synchronize(); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("the sealed weight after its node's restart: %v, bytes equal %v", err, bytes.Equal(got, w))
	}
	st.CopyFromDevice(got[:4096], plain)
	err = st.Synchronize()
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), addrA) || !strings.Contains(err.Error(), addrA+" restarted (boot ") {
		t.Fatalf("a plain buffer of the restarted node: %v, want unavailable naming %s", err, addrA)
	}
	after, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after.CopiedIn != before.CopiedIn {
		t.Fatalf("the tenant copied %d bytes in after the restart, want none", after.CopiedIn-before.CopiedIn)
	}
}
