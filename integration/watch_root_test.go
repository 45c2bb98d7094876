package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/containerd/v2/plugins"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/internal/testenv"
)

// startContainerd starts a private containerd (its own root, state and
// sockets under a temporary directory, CRI off) and returns its socket. It
// skips the test unless it runs as root on a host with containerd.
func startContainerd(t *testing.T) (dir, sock string) {
	t.Helper()
	testenv.NeedRoot(t, "needs root to run containerd")
	bin, err := exec.LookPath("containerd")
	if err != nil {
		testenv.Missing(t, "containerd is not installed (apt-get install containerd runc)")
	}
	// A short path: unix socket names are limited to 108 bytes.
	dir, err = os.MkdirTemp("", "vgpu-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "c.sock")
	cfg := filepath.Join(dir, "config.toml")
	writeFile(t, cfg, fmt.Appendf(nil, `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt")), 0o600)
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log:\n%s", b)
			}
		}
		os.RemoveAll(dir)
	})
	return dir, sock
}

// TestWatchContainerdReal runs the watcher against a real containerd that
// starts after it: deleting a container record, and the exit of a task's
// init process (not of an exec'd one), reach gone within 5 s.
func TestWatchContainerdReal(t *testing.T) {
	dir, sock := startContainerd(t)
	log, _ := logtest.NewNullLogger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := make(chan string, 16)
	connected := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- watchContainerd(ctx, sock, log, func(g Gone) { gone <- g.Namespace + "/" + g.ID }, func() { connected <- struct{}{} })
	}()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-connected:
	case <-time.After(20 * time.Second):
		t.Fatal("the watcher did not connect to containerd within 20 s")
	}
	// The subscription is registered by the server right after the stream
	// opens; give it a moment.
	time.Sleep(200 * time.Millisecond)

	expect := func(t *testing.T, want string) {
		t.Helper()
		select {
		case got := <-gone:
			if got != want {
				t.Fatalf("gone(%s), want gone(%s)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no gone(%s) within 5 s", want)
		}
	}
	quiet := func(t *testing.T, d time.Duration) {
		t.Helper()
		select {
		case got := <-gone:
			t.Fatalf("unexpected gone(%s)", got)
		case <-time.After(d):
		}
	}

	c, err := client.New(sock, client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nctx := namespaces.WithNamespace(ctx, "vgpu-test")

	t.Run("container delete", func(t *testing.T) {
		ctr, err := c.NewContainer(nctx, "record-only", client.WithRuntime(plugins.RuntimeRuncV2, nil), client.WithNewSpec())
		if err != nil {
			t.Fatal(err)
		}
		quiet(t, 300*time.Millisecond) // creating is no end
		if err := ctr.Delete(nctx); err != nil {
			t.Fatal(err)
		}
		expect(t, "vgpu-test/record-only")
	})

	t.Run("task exit", func(t *testing.T) {
		rootfs := hostRootfs(t, dir)
		ctr, err := c.NewContainer(nctx, "sleeper",
			// runc's state under the private directory too.
			client.WithRuntime(plugins.RuntimeRuncV2, &options.Options{Root: filepath.Join(dir, "runc")}),
			client.WithNewSpec(oci.WithRootFSPath(rootfs), oci.WithRootFSReadonly(), oci.WithMounts(hostMounts(t)), oci.WithProcessArgs("/bin/sleep", "60")))
		if err != nil {
			t.Fatal(err)
		}
		defer ctr.Delete(context.WithoutCancel(nctx))
		task, err := ctr.NewTask(nctx, cio.NullIO)
		if err != nil {
			// A host where runc cannot start containers loses only this
			// part; CI must have it.
			testenv.Missing(t, fmt.Sprintf("runc cannot start a container here: %v", err))
		}
		defer task.Delete(context.WithoutCancel(nctx), client.WithProcessKill)
		exited, err := task.Wait(nctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(nctx); err != nil {
			testenv.Missing(t, fmt.Sprintf("runc cannot start a container here: %v", err))
		}

		// An exec'd process that exits is not the container's end.
		p, err := task.Exec(nctx, "exec-true", &specs.Process{Args: []string{"/bin/true"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}}, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		pexit, err := p.Wait(nctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(nctx); err != nil {
			t.Fatal(err)
		}
		<-pexit
		if _, err := p.Delete(nctx); err != nil {
			t.Fatal(err)
		}
		quiet(t, 500*time.Millisecond)

		// The init process dies without any poststop: gone within 5 s.
		if err := task.Kill(nctx, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		expect(t, "vgpu-test/sleeper") // /tasks/exit
		<-exited
		if _, err := task.Delete(nctx); err != nil {
			t.Fatal(err)
		}
		expect(t, "vgpu-test/sleeper") // /tasks/delete
		if err := ctr.Delete(nctx); err != nil {
			t.Fatal(err)
		}
		expect(t, "vgpu-test/sleeper") // /containers/delete
	})

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WatchContainerd = %v, want context.Canceled", err)
		}
		done <- err // for the deferred receive
	case <-time.After(2 * time.Second):
		t.Fatal("WatchContainerd did not return after cancel")
	}
}

// hostRootfs makes an empty root filesystem whose /usr (and /bin, /lib...)
// come from the host through hostMounts or, on a merged-/usr host, symlinks.
func hostRootfs(t *testing.T, dir string) string {
	t.Helper()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64"} {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + d)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(rootfs, d)); err != nil {
				t.Fatal(err)
			}
		case fi.IsDir():
			if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return rootfs
}

// hostMounts bind-mounts the host's program directories read-only.
func hostMounts(t *testing.T) []specs.Mount {
	t.Helper()
	var ms []specs.Mount
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"} {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue // absent, or a merged-/usr symlink made by hostRootfs
		}
		ms = append(ms, specs.Mount{Destination: d, Type: "bind", Source: d, Options: []string{"rbind", "ro"}})
	}
	return ms
}
