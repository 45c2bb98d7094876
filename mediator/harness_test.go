package mediator_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"math/rand/v2"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// system is a mediator on a Unix socket in front of real sim nodes on
// loopback, all in this process.
type system struct {
	socket string
	dir    string // the temporary directory the socket is in
	med    *mediator.Mediator
	nodes  []*accelerator.Node
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l
}

// start brings up nodes nodes of devs devices of size bytes each.
func start(t testing.TB, nodes, devs int, size uint64, tenantMemory uint64) *system {
	return startNodes(t, nodes, devs, size, func(c *mediator.Config) { c.TenantMemory = tenantMemory })
}

// startWith is one node with one device and a configuration of the test's
// choosing.
func startWith(t testing.TB, devSize uint64, edit func(*mediator.Config)) *system {
	return startNodes(t, 1, 1, devSize, edit)
}

// startNodes starts nodes and a mediator whose configuration edit may
// change; its socket, container directory and state directory are in a
// short temporary directory (socket paths are limited to 108 bytes).
func startNodes(t testing.TB, nodes, devs int, size uint64, edit func(*mediator.Config)) *system {
	t.Helper()
	tmp, err := os.MkdirTemp("", "vgpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	s := &system{socket: filepath.Join(tmp, "m.sock"), dir: tmp}
	cfg := mediator.Config{ContainerDir: filepath.Join(tmp, "c"), StateDir: tmp, Log: quietLog()}
	for range nodes {
		n, addr, err := accelerator.StartSim("127.0.0.1:0", devs, size, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		s.nodes = append(s.nodes, n)
		cfg.Nodes = append(cfg.Nodes, addr.String())
	}
	if edit != nil {
		edit(&cfg)
	}
	m, err := mediator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	t.Cleanup(func() { m.Close() })
	s.med = m
	return s
}

func (s *system) dial(t testing.TB, tenant string, devices int) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{Socket: s.socket, Tenant: tenant, Devices: devices})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitIdle waits until no session is open and every node has all frames free.
func (s *system) waitIdle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.med.Status()
		used := uint64(0)
		for _, n := range st.Nodes {
			for _, d := range n.Devices {
				used += d.Used
			}
		}
		if len(st.Tenants) == 0 && used == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("system not idle after 5s: %d sessions, %d bytes of device memory used", len(st.Tenants), used)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantErr checks that err carries sentinel and mentions each of names.
func wantErr(t testing.TB, err, sentinel error, names ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v: want %v", err, sentinel)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Fatalf("error %q does not name %q", err, n)
		}
	}
}

func randomBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// waitIdleExcept waits until only `keep` sessions remain and the device
// memory in use is what those sessions hold.
func (s *system) waitIdleExcept(t testing.TB, keep int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.med.Status()
		var used, held uint64
		for _, n := range st.Nodes {
			for _, d := range n.Devices {
				used += d.Used
			}
		}
		for _, tn := range st.Tenants {
			held += tn.Mapped
		}
		if len(st.Tenants) == keep && used == held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %d sessions (want %d), %d bytes used on devices, %d held by sessions", len(st.Tenants), keep, used, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sleepBriefly() { time.Sleep(10 * time.Millisecond) }
