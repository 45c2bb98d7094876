package root

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// snapshotter unpacks the OCI image for the containerd client test;
// overlayfs works on these machines' ext4.
const snapshotter = "overlayfs"

// Issue test 5: the path nerdctl and Kubernetes take. Through the
// containerd Go client: an image imported from an OCI archive and
// unpacked, a container with runtime io.containerd.runc.v2 whose options
// name vgpu-runtime as BinaryName, and the request as the annotation
// vgpu.io/memory=128MiB. The tenant comes from the runtime's name
// (vgpu-runtime-team-b); the namespace maps to none.
func TestContainerdClientRuncV2BinaryName(t *testing.T) {
	h := vgpuEnv(t)
	h.runClientContainer(t, "vgpu-e2e-client", h.runtimeWrapper(t, "team-b"))
}

// Issue #21 item 7: the runtime as vgpuctl install containerd leaves it,
// with no wrapper script between containerd and vgpu-runtime: BinaryName
// is the link the install made (vgpu-runtime-team-b, no arguments), and
// the settings file it wrote gives the runtime its tenant, this harness's
// mediator socket and state directory (not the defaults, so a container
// that computes proves they were read). A link under a name the file does
// not know (the engine's name for the runtime, vgpu-team-b) is refused at
// create, naming itself, and registers nothing.
func TestContainerdRuntimeFromInstalledSettings(t *testing.T) {
	h := vgpuEnv(t)
	if !slices.Contains(runtimehook.DefaultRuntimes, h.runc) {
		t.Skipf("runc is %s, not one vgpu-runtime finds without --vgpu-runtime (%v)", h.runc, runtimehook.DefaultRuntimes)
	}
	sbin := filepath.Join(h.dir, "sbin")
	runtimePath := filepath.Join(sbin, "vgpu-runtime")
	stranger := filepath.Join(sbin, "vgpu-team-b")
	os.RemoveAll(sbin)
	if err := os.MkdirAll(sbin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{runtimePath, stranger} {
		if err := os.Symlink(h.binPath("vgpu-runtime"), l); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(h.settings) })
	install := []string{"install", "containerd", "--config", filepath.Join(h.dir, "cri.toml"), "--runtime-path", runtimePath,
		"--tenant", "team-b", "--settings", h.settings, "--mediator-socket", h.medSock, "--state-dir", h.ctrDir}
	h.vgpuctl(t, install...)
	again := string(h.vgpuctl(t, install...))
	for _, want := range []string{"already up to date, nothing written", "runtime settings already in place", "link to " + runtimePath + " already in place"} {
		if !strings.Contains(again, want) {
			t.Errorf("install run again: no %q in\n%s", want, again)
		}
	}
	h.runClientContainer(t, "vgpu-e2e-settings", runtimePath+"-team-b")

	c, ctx := h.containerd(t, ctrNS)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctr := h.newClientContainer(t, ctx, c, "vgpu-e2e-stranger", stranger)
	defer ctr.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, io.Discard, io.Discard), cio.WithFIFODir(h.fifoDir)))
	if err == nil {
		task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
		t.Fatalf("a task under %s was created; want it refused", stranger)
	}
	if want := fmt.Sprintf("run as %q", stranger); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "refusing to create the container") {
		t.Fatalf("create under %s: %v; want a refusal with %s", stranger, err, want)
	}
	t.Logf("refused: %v", err)
	if tb := tenant(h.tenants(t), "team-b"); tb.Containers != 0 {
		t.Errorf("tenant team-b has %d containers after a refused create", tb.Containers)
	}
	h.waitIdle(t, 10*time.Second, "after a refused create")
}

// runClientContainer runs a container through the containerd client with
// runtime io.containerd.runc.v2 and BinaryName binary, asking for 128MiB
// by annotation, and checks that it is registered for team-b, computes on
// its vGPU and is released when deleted.
func (h *harness) runClientContainer(t *testing.T, id, binary string) {
	t.Helper()
	c, ctx := h.containerd(t, ctrNS)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	ctr := h.newClientContainer(t, ctx, c, id, binary)
	defer ctr.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)

	var stdout, stderr lockedBuffer
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(h.fifoDir)))
	if err != nil {
		t.Fatalf("new task (runtime create, with the createRuntime hook): %v", err)
	}
	defer task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)

	// Created: the hook has registered the container, for the runtime's tenant.
	if tb := tenant(h.tenants(t), "team-b"); tb.Containers != 1 || tb.Reserved != 128<<20 {
		t.Errorf("tenant team-b after create: %d containers, %d bytes reserved; want 1, %d", tb.Containers, tb.Reserved, 128<<20)
	}
	exitC, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	var code uint32
	select {
	case st := <-exitC:
		code = st.ExitCode()
	case <-time.After(time.Minute):
		task.Kill(ctx, syscall.SIGKILL)
		t.Fatalf("the task did not exit within a minute; stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("delete the task (runtime delete, with the poststop hook): %v", err)
	}
	want := []string{"socket=/run/vgpu/mediator.sock", "ok"}
	if got := lines(stdout.String()); code != 0 || !slices.Equal(got, want) {
		t.Fatalf("exit code %d, output %q, want 0 and %q; stderr:\n%s", code, got, want, stderr.String())
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("delete the container: %v", err)
	}
	took := h.waitIdle(t, 10*time.Second, "after the task and container were deleted")
	t.Logf("mediator idle %v after the delete", took)
}

// newClientContainer imports the test image from an OCI archive (once per
// run: a second import finds it), unpacks it and makes container id with
// runtime io.containerd.runc.v2 and BinaryName binary, asking for 128MiB by
// the annotation vgpu.io/memory.
func (h *harness) newClientContainer(t *testing.T, ctx context.Context, c *client.Client, id, binary string) client.Container {
	t.Helper()
	archive, err := ociArchive(ctrImage, h.tarball)
	if err != nil {
		t.Fatalf("OCI archive: %v", err)
	}
	imgs, err := c.Import(ctx, bytes.NewReader(archive))
	if err != nil {
		t.Fatalf("import the OCI archive: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Name != ctrImage {
		t.Fatalf("imported %+v, want one image %s", imgs, ctrImage)
	}
	img := client.NewImage(c, imgs[0])
	if err := img.Unpack(ctx, snapshotter); err != nil {
		t.Fatalf("unpack with %s: %v", snapshotter, err)
	}

	ctr, err := c.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(snapshotter),
		client.WithNewSnapshot(id+"-snapshot", img),
		client.WithRuntime("io.containerd.runc.v2", &options.Options{
			BinaryName: binary,
			Root:       filepath.Join(h.runcRoots, "containerd"),
		}),
		client.WithNewSpec(
			oci.WithImageConfig(img),
			oci.WithHostname("e2e"),
			oci.WithProcessArgs("/bin/sh", "-c", `echo "socket=$VGPU_SOCKET"; exec /testimage`),
			oci.WithAnnotations(map[string]string{"vgpu.io/memory": "128MiB"}),
		))
	if err != nil {
		t.Fatalf("new container: %v", err)
	}
	return ctr
}

// runtimeWrapper is the BinaryName for a tenant: a symlink
// vgpu-runtime-<tenant> to vgpu-runtime (the name tells the tenant, as
// containerd's BinaryName carries no arguments), called by a script that
// adds this harness's --vgpu-* flags (socket, state, hook and runc
// paths), as dockerd does for a runtime's runtimeArgs.
func (h *harness) runtimeWrapper(tb testing.TB, tenant string) string {
	tb.Helper()
	dir := filepath.Join(h.dir, "rt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	link := filepath.Join(dir, "vgpu-runtime-"+tenant)
	if err := os.Symlink(h.binPath("vgpu-runtime"), link); err != nil && !os.IsExist(err) {
		tb.Fatal(err)
	}
	script := filepath.Join(dir, "e2e-"+tenant)
	quoted := []string{shellQuote(link)}
	for _, a := range h.runtimeArgs() {
		quoted = append(quoted, shellQuote(a))
	}
	body := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", strings.Join(quoted, " "))
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		tb.Fatal(err)
	}
	return script
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// lockedBuffer is a bytes.Buffer safe for the copy goroutine of cio and
// the test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
