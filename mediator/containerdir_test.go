package mediator

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// holdRelease makes a release of ctr wait, as a session slow to tear down
// does, until the returned function is called.
func holdRelease(t *testing.T, ctr *container) func() {
	t.Helper()
	nc, peer := net.Pipe()
	t.Cleanup(func() { peer.Close() })
	if err := ctr.track(nc); err != nil {
		t.Fatal(err)
	}
	return func() { ctr.untrack(nc) }
}

// waitReleasing waits until a release of k is in progress.
func waitReleasing(t *testing.T, m *Mediator, k ctrKey) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		busy := m.releasing[k] != nil
		m.mu.Unlock()
		if busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no release of %v in progress", k)
		}
	}
}

// A Docker restart while the previous registration's release is still in
// progress: the runtime's poststop removed the old socket directory, the
// wrapper made a new one, which runc mounted at the container's /run/vgpu,
// and the hook's registration waits for the release. The release must not
// remove the new directory: the container's socket has to be in the very
// directory the container sees.
func TestReleaseKeepsTheRestartedContainersDirectory(t *testing.T) {
	m, _ := startLimited(t)
	k := ctrKey{"moby", "r1"}
	dir := vocab.HostSocketDir(m.cfg.ContainerDir, k.namespace, k.id)
	reg := api.Register{Container: k.id, Namespace: k.namespace, Tenant: "t", Memory: 8 << 20, Devices: 1, Pid: uint32(os.Getpid()), SocketDir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil { // the wrapper's, at create
		t.Fatal(err)
	}
	if _, err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	unblock := holdRelease(t, m.containers[k])
	m.mu.Unlock()
	released := make(chan error, 1)
	go func() { released <- m.Release(k.namespace, k.id) }()
	waitReleasing(t, m, k)

	// The restart: poststop removes the directory, the wrapper makes it
	// again, runc mounts it (held open here, as the mount holds it).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mounted, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mounted.Close()
	registered := make(chan error, 1)
	go func() {
		_, err := m.Register(reg)
		registered <- err
	}()
	unblock()
	for _, ch := range []chan error{released, registered} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("release or registration still waits")
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/self/fd/%d/%s", mounted.Fd(), SocketName)); err != nil {
		t.Fatalf("the container's mounted directory lacks its socket: %v", err)
	}
	if err := m.Release(k.namespace, k.id); err != nil {
		t.Fatal(err)
	}
	// The runtime's directory is the runtime's to remove (poststop).
	if _, err := os.Stat(fmt.Sprintf("/proc/self/fd/%d/%s", mounted.Fd(), SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after the release: %v", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("the release removed the runtime's directory: %v", err)
	}
}

// A registration from a runtime names its socket directory: the one the
// runtime made and mounted. Where it is gone, a new one would not be the
// container's, so the registration fails rather than make it.
func TestRuntimeRegistrationNeedsItsDirectory(t *testing.T) {
	m, _ := startLimited(t)
	dir := vocab.HostSocketDir(m.cfg.ContainerDir, "moby", "gone")
	_, err := m.Register(api.Register{Container: "gone", Namespace: "moby", Tenant: "t", Memory: 8 << 20, Devices: 1, SocketDir: dir})
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), dir) {
		t.Fatalf("register without the runtime's directory: %v", err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the mediator made the runtime's directory: %v", err)
	}
	if infos := m.admission.Tenants(); len(infos) != 1 || infos[0].Containers != 2 {
		t.Fatalf("a failed registration kept its admission: %+v", infos)
	}
}

// A registration without a runtime (from the host socket) gets a directory
// the mediator makes, and its release removes it, but only that very
// directory: one put in its place since is someone else's.
func TestReleaseRemovesOnlyItsOwnDirectory(t *testing.T) {
	m, _ := startLimited(t)
	dir := vocab.HostSocketDir(m.cfg.ContainerDir, "", "c1")
	if err := m.Release("", "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the mediator's directory left after the release: %v", err)
	}
	dir2 := vocab.HostSocketDir(m.cfg.ContainerDir, "", "c2")
	if err := os.Rename(dir2, dir2+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir2, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Release("", "c2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir2); err != nil {
		t.Fatalf("the release removed a directory made in place of its own: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir2+".old", SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the release left its socket: %v", err)
	}
}

// A registration waits for the release of its container's previous one no
// longer than the hook that asks for it lives, less the hook's own work
// (reading config.json, checking the mount point, dialling): a
// registration that outlived its hook would admit a container whose start
// has failed.
func TestRegisterWaitFitsTheHookDeadline(t *testing.T) {
	const hookWork = 2 * time.Second
	if registerWait+hookWork > runtimehook.HookDeadline {
		t.Fatalf("a registration waits up to %v for a release; the hook gives up after %v and needs %v of that for its own work",
			registerWait, runtimehook.HookDeadline, hookWork)
	}
}
