package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/isolation"
)

// serverPid returns the pid of the process listening at socket.
func serverPid(t *testing.T, socket string) int {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	if err := raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return int(cred.Pid)
}

// reloadRefused runs vgpuctl tenants reload, which must fail within 10s
// with an error that says each of want.
func reloadRefused(t *testing.T, socket string, want ...string) {
	t.Helper()
	start := time.Now()
	out, err := run(t, "vgpuctl", "--socket", socket, "--timeout", "10s", "tenants", "reload")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("vgpuctl tenants reload took %v", took)
	}
	if err == nil {
		t.Fatalf("vgpuctl tenants reload succeeded:\n%s", out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("vgpuctl tenants reload does not say %q:\n%s", w, out)
		}
	}
}

// TestQuotaPathNotARegularFile: a quota path that comes to name a FIFO, or
// /dev/zero through a symlink, wedges nothing: SIGHUP's reload and
// vgpuctl tenants reload are refused at once, naming the path and what it
// is; sessions go on; SIGTERM stops the mediator cleanly. A mediator
// started with such a path refuses to start, saying why.
func TestQuotaPathNotARegularFile(t *testing.T) {
	for _, tc := range []struct {
		name, is string
		make     func(path string) error
	}{
		{"FIFO", "FIFO", func(p string) error { return syscall.Mkfifo(p, 0o600) }},
		{"/dev/zero", "character device", func(p string) error { return os.Symlink("/dev/zero", p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A missing quota file at start is the built-in default.
			quota := filepath.Join(t.TempDir(), "tenants.toml")
			socket := startSystem(t, []string{"--devices", "1", "--memory", "256MiB"}, []string{"--quota", quota})
			pid := serverPid(t, socket)
			if err := tc.make(quota); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			reloadRefused(t, socket, quota, tc.is, "not a regular file", "keeping the current quotas")
			if out, err := run(t, "tenant", "--socket", socket, "--tenant", "after-reload"); err != nil || strings.TrimSpace(out) != "ok" {
				t.Fatalf("tenant after the refused reloads: %v\n%s", err, out)
			}
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// A clean stop removes the socket; startProc's clean-up checks
			// the exit status.
			waitFor(t, "the mediator to stop on SIGTERM", func() bool { _, err := os.Stat(socket); return os.IsNotExist(err) })

			dir := t.TempDir()
			out, err := run(t, "vgpu-mediator", "--socket", filepath.Join(dir, "m.sock"), "--embedded-memory", "64MiB",
				"--state-dir", "", "--containerd", "", "--quota", quota)
			if err == nil || !strings.Contains(out, quota) || !strings.Contains(out, tc.is) {
				t.Fatalf("mediator started with quota file %s: err %v, want a refusal naming it and %q:\n%s", quota, err, tc.is, out)
			}
		})
	}
}

// TestQuotaFileOverTheLimit: a quota file over isolation.MaxQuotaFile is
// refused by a reload, naming its path, its size and the limit; the old
// quotas stay.
func TestQuotaFileOverTheLimit(t *testing.T) {
	quota := filepath.Join(t.TempDir(), "tenants.toml")
	if err := os.WriteFile(quota, []byte("[tenants.kept]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := startSystem(t, []string{"--devices", "1", "--memory", "256MiB"}, []string{"--quota", quota})
	size := 2 * isolation.MaxQuotaFile
	big := "[tenants.big]\n#" + strings.Repeat("x", size-len("[tenants.big]\n#")-1) + "\n"
	if err := os.WriteFile(quota, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	reloadRefused(t, socket, quota, fmt.Sprintf("is %d bytes", size), fmt.Sprintf("limit of %d", isolation.MaxQuotaFile))
	out, err := run(t, "vgpuctl", "--socket", socket, "tenants")
	if err != nil || !strings.Contains(out, "kept") || strings.Contains(out, "big") {
		t.Fatalf("vgpuctl tenants after the refused reload: %v, want the old tenant kept\n%s", err, out)
	}
}

// TestQuotaReloadOnSIGHUP: SIGHUP makes a running mediator read its quota
// file again and apply it — the tenants and limits vgpuctl lists change —
// and the mediator goes on serving (SIGHUP's default action would end it).
func TestQuotaReloadOnSIGHUP(t *testing.T) {
	quota := filepath.Join(t.TempDir(), "tenants.toml")
	if err := os.WriteFile(quota, []byte("[tenants.before]\nmemory = \"64MiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := startSystem(t, []string{"--devices", "1", "--memory", "256MiB"}, []string{"--quota", quota})
	tenants := func() string {
		out, err := run(t, "vgpuctl", "--socket", socket, "tenants")
		if err != nil {
			t.Fatalf("vgpuctl tenants: %v\n%s", err, out)
		}
		return out
	}
	if out := tenants(); !strings.Contains(out, "before") || !strings.Contains(out, "64.0 MiB") {
		t.Fatalf("vgpuctl tenants before the reload lacks tenant before and its 64 MiB:\n%s", out)
	}
	if err := os.WriteFile(quota, []byte("[tenants.after]\nmemory = \"96MiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pid := serverPid(t, socket)
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var out string
	waitFor(t, "the reload to list tenant after", func() bool {
		out = tenants()
		return strings.Contains(out, "after")
	})
	if strings.Contains(out, "before") || !strings.Contains(out, "96.0 MiB") {
		t.Fatalf("vgpuctl tenants after SIGHUP still lists tenant before, or lacks after's 96 MiB:\n%s", out)
	}
	if got := serverPid(t, socket); got != pid {
		t.Fatalf("the mediator's pid went from %d to %d", pid, got)
	}
	if out, err := run(t, "tenant", "--socket", socket, "--tenant", "after"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("a session after the reload: %v\n%s", err, out)
	}
}
