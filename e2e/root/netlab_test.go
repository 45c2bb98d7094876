package root

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	vgpudaemon "github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/netlab"
	"github.com/vgpu/vgpu/mediator"
)

// TestNetlabTwoMediators runs a vgpu-node and two vgpu-mediators on three
// hosts of a netlab (network namespaces on a bridge): m1's link has 2ms of
// delay each way, m2's none. A round trip to the device through m1 takes
// the delay and through m2 it does not; with m1 cut off, a new session on
// m1 fails as unavailable while m2 goes on serving, and once healed m1
// serves again, its old session included: the cut is shorter than the
// node and mediator timeouts (TestNetlabNodeTimeout has one longer).
//
// It needs root (network namespaces) but not Docker: it takes the
// harness's binaries when the harness is up, and builds them otherwise.
func TestNetlabTwoMediators(t *testing.T) {
	lab := netlab.New(t, "node", "m1", "m2")
	shaper, why := lab.Shaper()
	t.Logf("netlab shaper: %s (%s)", shaper, why)
	bin := netlabBinaries(t)

	const port = 7070
	// The cut below lasts the mediator's dial timeout and more; m1's idle
	// session outlives it only if neither end gives up on the other first.
	const peerTimeout = mediator.DialTimeout + time.Minute
	nodeAddr := lab.Addr("node", port)
	startLabNode(t, lab, bin, "node", nodeAddr, "m2", "--devices", "1", "--memory", "256MiB",
		"--mediator-timeout", peerTimeout.String(), "--log-level", "warn")
	// Shaped before the mediator starts, so that all its connections to
	// the node cross the delay.
	const delay = 2 * time.Millisecond
	lab.Shape("m1", netlab.Netem{Delay: delay})

	dir := t.TempDir()
	sockets := map[string]string{}
	for _, m := range []string{"m1", "m2"} {
		sock := filepath.Join(dir, m+".sock")
		sockets[m] = sock
		startLabMediator(t, lab, bin, m, sock, dir, "--node", nodeAddr, "--node-timeout", peerTimeout.String(), "--log-level", "info")
	}

	// Sessions live in this process; a Unix socket is a file, the same
	// in every network namespace.
	sessions := map[string]*netlabSession{}
	for _, m := range []string{"m1", "m2"} {
		s, err := openNetlabSession(sockets[m], "tenant-"+m)
		if err != nil {
			t.Fatalf("session on %s: %v", m, err)
		}
		t.Cleanup(func() { s.c.Close() })
		sessions[m] = s
	}
	rt := map[string]time.Duration{}
	for _, m := range []string{"m1", "m2"} {
		d, err := sessions[m].fastest(10)
		if err != nil {
			t.Fatalf("round trip through %s: %v", m, err)
		}
		rt[m] = d
	}
	t.Logf("fastest of 10 device round trips: m1 %v (link delayed %v each way), m2 %v", rt["m1"], delay, rt["m2"])
	if rt["m1"] < delay {
		t.Errorf("round trip through m1 = %v, want at least %v: the delay did not shape m1's link", rt["m1"], delay)
	}
	if rt["m2"] >= delay {
		t.Errorf("round trip through m2 = %v, want under %v: m2's link is not shaped", rt["m2"], delay)
	}

	// Partition m1. A new session there needs a connection to the node,
	// which cannot be made: the mediator gives up after its dial timeout.
	lab.Cut("m1")
	cutAt := time.Now()
	type result struct {
		err  error
		took time.Duration
	}
	m1 := make(chan result, 1)
	go func() {
		s, err := openNetlabSession(sockets["m1"], "tenant-m1-cut")
		if err == nil {
			s.c.Close()
		}
		m1 <- result{err, time.Since(cutAt)}
	}()
	// Meanwhile m2 serves: new sessions and round trips, and the example
	// tenant program run from m2's host.
	m2ops := 0
	var got result
	deadline := cutAt.Add(mediator.DialTimeout + 10*time.Second)
wait:
	for {
		select {
		case got = <-m1:
			break wait
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("a session on the cut-off m1 neither opened nor failed within %v", time.Since(cutAt))
		}
		s, err := openNetlabSession(sockets["m2"], "tenant-m2-during-cut")
		if err == nil {
			_, err = s.fastest(1)
			s.c.Close()
		}
		if err != nil {
			t.Fatalf("m2 while m1 is cut off (after %d good sessions): %v", m2ops, err)
		}
		if m2ops == 0 {
			out, err := lab.Command("m2", bin["tenant"], "--socket", sockets["m2"], "--tenant", "example", "--n", "4096").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "ok" {
				t.Fatalf("examples/tenant on m2 while m1 is cut off: %v\n%s", err, out)
			}
		}
		m2ops++
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("m1 cut off: a new session failed after %v: %v; m2 served %d sessions meanwhile", got.took, got.err, m2ops)
	if !errors.Is(got.err, api.ErrUnavailable) {
		t.Errorf("new session on the cut-off m1: %v, want an error that is api.ErrUnavailable", got.err)
	}

	lab.Heal("m1")
	// The session m1 had stayed idle through the cut, shorter than the
	// timeouts; its connection to the node survives, and so does a new one.
	if d, err := sessions["m1"].fastest(3); err != nil {
		t.Errorf("m1's old session after Heal: %v", err)
	} else if d < delay {
		t.Errorf("round trip through m1 after Heal = %v, want at least %v (the shape is back)", d, delay)
	}
	s, err := openNetlabSession(sockets["m1"], "tenant-m1-healed")
	if err != nil {
		t.Fatalf("new session on m1 after Heal: %v", err)
	}
	defer s.c.Close()
	if _, err := s.fastest(1); err != nil {
		t.Errorf("new session on m1 after Heal: %v", err)
	}
}

// netlabSession is a tenant session with a small buffer on the device.
type netlabSession struct {
	c   *client.Client
	buf client.Ptr
}

// openNetlabSession opens a session on the mediator at socket and
// allocates its buffer.
func openNetlabSession(socket, tenant string) (*netlabSession, error) {
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		return nil, err
	}
	p, err := c.Malloc(0, 4096)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("malloc 4096 bytes: %w", err)
	}
	return &netlabSession{c: c, buf: p}, nil
}

// fastest returns the fastest of n synchronous device round trips: a
// 4-byte copy to the device and back, then a synchronize.
func (s *netlabSession) fastest(n int) (time.Duration, error) {
	best := time.Duration(1<<63 - 1)
	st := s.c.Stream()
	in, out := []byte{1, 2, 3, 4}, make([]byte, 4)
	for i := range n {
		in[0] = byte(i)
		start := time.Now()
		st.CopyToDevice(s.buf, in)
		st.CopyFromDevice(out, s.buf)
		if err := st.Synchronize(); err != nil {
			return 0, err
		}
		best = min(best, time.Since(start))
		if out[0] != in[0] {
			return 0, fmt.Errorf("read back %v from the device, wrote %v", out, in)
		}
	}
	return best, nil
}

// startLabNode starts vgpu-node on host, listening on addr with args
// besides, and waits until host from can connect to it.
func startLabNode(t *testing.T, lab *netlab.Lab, bin map[string]string, host, addr, from string, args ...string) *netlab.Proc {
	t.Helper()
	p := lab.Start(host, bin["vgpu-node"], append([]string{"--listen", addr}, args...)...)
	if err := p.WaitUp(10*time.Second, func() bool {
		c, err := lab.Dial(context.Background(), from, "tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// startLabMediator starts vgpu-mediator on host, serving the Unix socket
// sock, its state and container directories under dir, no quota file and
// no containerd, with args besides, and waits for the socket.
func startLabMediator(t *testing.T, lab *netlab.Lab, bin map[string]string, host, sock, dir string, args ...string) *netlab.Proc {
	t.Helper()
	p := lab.Start(host, bin["vgpu-mediator"], append([]string{"--socket", sock,
		"--state-dir", filepath.Join(dir, host+"-state"), "--container-dir", filepath.Join(dir, host+"-containers"),
		"--quota", "", "--containerd", ""}, args...)...)
	if err := p.WaitUp(15*time.Second, func() bool { return vgpudaemon.Serving(sock) }); err != nil {
		t.Fatal(err)
	}
	return p
}

// netlabBinaries returns the paths of vgpu-node, vgpu-mediator and the
// example tenant: the harness's when it is up (or VGPU_E2E_BIN's), else
// built here with goBuild, as the harness builds them.
func netlabBinaries(t *testing.T) map[string]string {
	t.Helper()
	bin := map[string]string{}
	dir := os.Getenv(binEnv)
	if dir == "" && h != nil && setupErr == nil {
		dir = h.bin
		bin["tenant"] = filepath.Join(h.rootfs, "tenant")
	}
	for _, name := range []string{"vgpu-node", "vgpu-mediator"} {
		if dir != "" && (h == nil || h.missing[name] == nil) {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				bin[name] = filepath.Join(dir, name)
			}
		}
	}
	out := t.TempDir()
	for name, pkg := range map[string]string{"vgpu-node": "./cmd/vgpu-node", "vgpu-mediator": "./cmd/vgpu-mediator", "tenant": "./examples/tenant"} {
		if bin[name] != "" {
			continue
		}
		bin[name] = filepath.Join(out, name)
		if b, err := goBuild(bin[name], pkg, false); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	return bin
}
