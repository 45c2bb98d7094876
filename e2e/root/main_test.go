// Package root holds the root end-to-end tests: real Docker (dockerd of
// Debian's docker.io), containerd and runc start containers through
// vgpu-runtime and vgpu-hook, and the programs inside use their vGPU through
// a real vgpu-mediator and vgpu-node on loopback.
//
// They need root, docker, dockerd, containerd, containerd-shim-runc-v2, runc
// and a static busybox (Debian: docker.io containerd runc busybox-static).
// Without them every test skips, saying why; with VGPU_E2E_REQUIRE_ROOT=1
// (CI) a missing prerequisite is a failure instead.
//
// Everything is private to one run, under one short directory
// /tmp/vgpu-e2e-NNN (container sockets live at
// <dir>/c/<namespace>/<64-hex-id>/mediator.sock, which the mediator binds
// through its directory, as the path may pass sun_path's 108 bytes): a containerd
// with its own root, state, socket and config (CRI off); a dockerd on that
// containerd with its own data-root, exec-root, socket, pidfile and
// daemon.json that registers the runtime "vgpu"; the mediator and node. No
// system daemon is touched. TestMain tears it all down (containers, daemons,
// shims, mounts, the directory), and sweeps what a killed earlier run left.
//
// VGPU_E2E_BIN=DIR takes vgpu-node, vgpu-mediator, vgpuctl, vgpu-runtime and
// vgpu-hook from DIR instead of building them.
//
// The benchmark BenchmarkDockerRun compares start-to-exit time of docker run
// with the vgpu runtime and a vGPU request against plain runc:
//
//	go test -run '^$' -bench DockerRun -benchtime 1x ./e2e/root/
package root

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/testenv"
)

// binEnv names a directory of prebuilt binaries to use instead of building.
const binEnv = "VGPU_E2E_BIN"

var (
	h          *harness // set when the prerequisites are met
	skipReason string   // why the tests cannot run here
	setupErr   error    // the harness failed to come up
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if skipReason = prerequisites(); skipReason != "" {
		return m.Run()
	}
	sweepStale()
	h, setupErr = newHarness()
	defer func() {
		if h != nil {
			h.close()
		}
	}()
	return m.Run()
}

// tools are the programs the tests drive, found on PATH.
var tools = []string{"docker", "dockerd", "containerd", "containerd-shim-runc-v2", "runc", "busybox"}

// prerequisites says what is missing for the root tests, or "".
func prerequisites() string {
	if runtime.GOOS != "linux" {
		return "root e2e tests need Linux"
	}
	if os.Geteuid() != 0 {
		return "root e2e tests need root (CI runs them as root)"
	}
	// root's PATH without the sbin directories (su without -) would hide
	// dockerd and runc, from us and from the daemons that look them up.
	path := filepath.SplitList(os.Getenv("PATH"))
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		if !slices.Contains(path, d) {
			path = append(path, d)
		}
	}
	os.Setenv("PATH", strings.Join(path, string(filepath.ListSeparator)))
	var missing []string
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("root e2e tests need %s on PATH (Debian: apt-get install docker.io containerd runc busybox-static)",
			strings.Join(missing, ", "))
	}
	bb, _ := exec.LookPath("busybox")
	if !static(bb) {
		return fmt.Sprintf("%s is dynamically linked; the test image needs a static busybox (Debian: busybox-static)", bb)
	}
	return ""
}

// static reports whether the ELF file at path has no program interpreter.
func static(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// env returns the harness, or skips (fails, under VGPU_E2E_REQUIRE_ROOT=1)
// the test when the prerequisites are missing, and fails it when the
// harness did not come up.
func env(tb testing.TB) *harness {
	tb.Helper()
	if skipReason != "" {
		testenv.Missing(tb, skipReason)
	}
	if setupErr != nil {
		tb.Fatalf("root e2e harness: %v", setupErr)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			h.logTails(tb)
		}
	})
	return h
}

// vgpuEnv is env for tests that need the vGPU pieces: vgpu-runtime,
// vgpu-hook and a running mediator. It fails the test naming what is
// missing.
func vgpuEnv(tb testing.TB) *harness {
	tb.Helper()
	h := env(tb)
	var missing []string
	for _, name := range []string{"vgpu-runtime", "vgpu-hook"} {
		if err := h.missing[name]; err != nil {
			missing = append(missing, fmt.Sprintf("%s (cmd/%s) did not build: %v", name, name, err))
		}
	}
	if h.mediatorErr != nil {
		missing = append(missing, fmt.Sprintf("vgpu-mediator/vgpu-node: %v", h.mediatorErr))
	}
	if len(missing) > 0 {
		tb.Fatalf("this test needs the vGPU pieces:\n  %s", strings.Join(missing, "\n  "))
	}
	return h
}

// run runs a program with a timeout and returns its combined output.
func run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), ctx.Err())
	}
	return string(out), err
}

// vgpuctl runs vgpuctl against the mediator.
func (h *harness) vgpuctl(tb testing.TB, args ...string) []byte {
	tb.Helper()
	out, err := run(context.Background(), nil, h.binPath("vgpuctl"), append([]string{"--socket", h.medSock}, args...)...)
	if err != nil {
		tb.Fatalf("vgpuctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return []byte(out)
}

func (h *harness) status(tb testing.TB) api.Status {
	tb.Helper()
	var st api.Status
	out := h.vgpuctl(tb, "status", "--json")
	if err := json.Unmarshal(out, &st); err != nil {
		tb.Fatalf("vgpuctl status --json: %v\n%s", err, out)
	}
	return st
}

func (h *harness) tenants(tb testing.TB) []api.TenantInfo {
	tb.Helper()
	var ts []api.TenantInfo
	out := h.vgpuctl(tb, "tenants", "--json")
	if err := json.Unmarshal(out, &ts); err != nil {
		tb.Fatalf("vgpuctl tenants --json: %v\n%s", err, out)
	}
	return ts
}

func tenant(ts []api.TenantInfo, name string) api.TenantInfo {
	for _, t := range ts {
		if t.Name == name {
			return t
		}
	}
	return api.TenantInfo{Name: name}
}

// use describes what the mediator holds, or "" when it holds nothing: no
// session, no device memory in use, no registered container, nothing
// reserved or allocated, and no socket directory left in the container dir.
func (h *harness) use(tb testing.TB) string {
	tb.Helper()
	var held []string
	st := h.status(tb)
	for _, s := range st.Tenants {
		held = append(held, fmt.Sprintf("session %d of tenant %q (%d bytes allocated, %d mapped)", s.Session, s.Tenant, s.Allocated, s.Mapped))
	}
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if d.Used != 0 {
				held = append(held, fmt.Sprintf("node %s device %d: %d bytes used", n.Addr, d.Index, d.Used))
			}
		}
	}
	for _, t := range h.tenants(tb) {
		if t.Containers != 0 || t.Reserved != 0 || t.Allocated != 0 {
			held = append(held, fmt.Sprintf("tenant %q: %d containers, %d bytes reserved, %d allocated", t.Name, t.Containers, t.Reserved, t.Allocated))
		}
	}
	if names := containerDirs(h.ctrDir); len(names) > 0 {
		held = append(held, fmt.Sprintf("left in %s: %s", h.ctrDir, strings.Join(names, ", ")))
	}
	return strings.Join(held, "; ")
}

// containerDirs lists what is in dir, the containers' socket directories,
// as namespace/id: a namespace's directory stays after its containers'
// go, and is not listed when empty.
func containerDirs(dir string) []string {
	nss, _ := os.ReadDir(dir)
	var names []string
	for _, ns := range nss {
		if !ns.IsDir() {
			names = append(names, ns.Name())
			continue
		}
		ents, _ := os.ReadDir(filepath.Join(dir, ns.Name()))
		for _, e := range ents {
			names = append(names, ns.Name()+"/"+e.Name())
		}
	}
	return names
}

// waitIdle waits up to within for the mediator to hold nothing, and returns
// how long that took.
func (h *harness) waitIdle(tb testing.TB, within time.Duration, why string) time.Duration {
	tb.Helper()
	start := time.Now()
	for {
		u := h.use(tb)
		if u == "" {
			return time.Since(start)
		}
		if time.Since(start) > within {
			tb.Fatalf("%s: the mediator still holds, after %v: %s", why, within, u)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls ok every 50ms for up to within.
func waitFor(tb testing.TB, within time.Duration, what string, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lines splits out into trimmed, non-empty lines.
func lines(out string) []string {
	var ls []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			ls = append(ls, l)
		}
	}
	return ls
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	ls := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return string(bytes.Join(ls, []byte("\n")))
}

// errNotBuilt marks a binary that the harness could not build.
var errNotBuilt = errors.New("not built")

func (h *harness) binPath(name string) string { return filepath.Join(h.bin, name) }
