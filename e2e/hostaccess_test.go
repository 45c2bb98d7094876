package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/testenv"
)

// Who may act as which tenant on the host socket, with real processes: a
// mediator serving a quota file's [host] mapping, and tenant programs run
// as unprivileged uids.
const hostQuota = `[tenants.alice]
[tenants.bob]
[tenants.team-b]

# No access key: a quota file maps users to tenants by default.
[host.users]
4242 = ["alice"]

[host.groups]
2000 = ["team-b"]
`

// Groups of the unprivileged processes: socketGroup owns the socket (mode
// 0660), teamGroup is mapped to team-b.
const (
	socketGroup = 3000
	teamGroup   = 2000
)

// as is the credentials of a process run as uid with primary group gid
// and supplementary groups.
func as(uid, gid uint32, groups ...uint32) *syscall.Credential {
	return &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}
}

// runCred runs one of the built binaries with cred (nil: as the test's own
// user) and returns its output and exit status.
func runCred(t *testing.T, cred *syscall.Credential, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("%s: %v\n%s", name, err, out)
	return "", 0
}

// hostDir is a directory that unprivileged users may enter (t.TempDir and
// its parent are 0700), for a mediator's socket and quota file. The built
// binaries must be theirs to run too.
func hostDir(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t, "needs root, to run processes as other users")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vgpu-host")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startHostMediator starts a mediator with an embedded node on a socket in
// dir, run with cred (nil: as the test's user), and returns the socket.
func startHostMediator(t *testing.T, dir string, cred *syscall.Credential, flags ...string) string {
	t.Helper()
	socket := filepath.Join(dir, "m.sock")
	startProcAs(t, cred, "vgpu-mediator", append([]string{"--socket", socket, "--embedded-memory", "256MiB",
		"--state-dir", "", "--container-dir", filepath.Join(dir, "c"), "--containerd", "", "--log-level", "warn"}, flags...)...)
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })
	return socket
}

func TestHostAccessMapped(t *testing.T) {
	dir := hostDir(t)
	quota := filepath.Join(dir, "tenants.toml")
	if err := os.WriteFile(quota, []byte(hostQuota), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := startHostMediator(t, dir, nil, "--quota", quota, "--socket-mode", "0660", "--socket-group", "3000")

	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 || st.Gid != socketGroup {
		t.Fatalf("socket mode %v, group %d: want a socket, 0660, group %d", fi.Mode(), st.Gid, socketGroup)
	}

	// A session that opens runs the whole tenant program: it allocates,
	// copies and launches as the tenant it named.
	admitted := func(cred *syscall.Credential, tenant string) {
		t.Helper()
		if out, code := runCred(t, cred, "tenant", "--socket", socket, "--tenant", tenant, "--n", "1000"); code != 0 || strings.TrimSpace(out) != "ok" {
			t.Errorf("%+v as tenant %q: exit %d\n%s", cred, tenant, code, out)
		}
	}
	// A refusal must be the mediator's permission denied (tenantdial exits
	// 3 on errors.Is(err, api.ErrPermissionDenied)), naming uid and tenant.
	refused := func(cred *syscall.Credential, tenant string, more ...string) {
		t.Helper()
		out, code := runCred(t, cred, "tenantdial", "--socket", socket, "--tenant", tenant)
		if code != 3 {
			t.Errorf("uid %d as tenant %q: exit %d, want 3 (permission denied)\n%s", cred.Uid, tenant, code, out)
			return
		}
		for _, want := range append([]string{fmt.Sprintf("uid %d ", cred.Uid), `tenant "` + tenant + `"`, "permission denied"}, more...) {
			if !strings.Contains(out, want) {
				t.Errorf("uid %d as tenant %q: refusal does not say %q: %s", cred.Uid, tenant, want, out)
			}
		}
	}

	mapped := as(4242, 4242, socketGroup)
	admitted(mapped, "alice")
	refused(mapped, "bob", `lets it act as "alice" only`)
	refused(mapped, "default")

	nobody := as(65534, 65534, socketGroup)
	refused(nobody, "alice", "maps neither the uid nor its groups")

	// Groups: supplementary and primary.
	admitted(as(65534, 65534, socketGroup, teamGroup), "team-b")
	admitted(as(5555, teamGroup, socketGroup), "team-b")
	refused(as(65534, 65534, socketGroup, teamGroup), "alice", `lets it act as "team-b" only`)

	// Root is an operator: it may act as any tenant, the file's or not.
	admitted(nil, "bob")
	admitted(nil, "not-in-the-file")

	// The socket's mode keeps out a uid outside its group before any hello:
	// connect itself fails, and not with the mediator's refusal.
	if out, code := runCred(t, as(4242, 4242), "tenantdial", "--socket", socket, "--tenant", "alice"); code != 4 || !strings.Contains(out, "permission denied") {
		t.Errorf("uid 4242 outside the socket's group: exit %d, want 4 (connect: permission denied)\n%s", code, out)
	}

	// A reload applies the new mapping to the sessions opened after it.
	next := strings.Replace(hostQuota, `4242 = ["alice"]`, `65534 = ["alice"]`, 1)
	if err := os.WriteFile(quota, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "vgpuctl", "--socket", socket, "tenants", "reload"); err != nil {
		t.Fatalf("vgpuctl tenants reload: %v\n%s", err, out)
	}
	admitted(nobody, "alice")
	refused(mapped, "alice", "maps neither the uid nor its groups")
}

// Open access: any local user may name any tenant, the file's or not.
func TestHostAccessOpen(t *testing.T) {
	for _, tc := range []struct {
		name, quota string // quota "": no quota file (the embedded default)
	}{
		{"access open", "[host]\naccess = \"open\"\n[tenants.alice]\n"},
		{"no quota file", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := hostDir(t)
			quota := ""
			if tc.quota != "" {
				quota = filepath.Join(dir, "tenants.toml")
				if err := os.WriteFile(quota, []byte(tc.quota), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			socket := startHostMediator(t, dir, nil, "--quota", quota)
			if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o666 {
				t.Fatalf("socket: %v, %v: want mode 0666 by default", fi, err)
			}
			for _, tenant := range []string{"alice", "anyone"} {
				if out, code := runCred(t, as(65534, 65534), "tenant", "--socket", socket, "--tenant", tenant, "--n", "1000"); code != 0 {
					t.Errorf("uid 65534 as %q: exit %d\n%s", tenant, code, out)
				}
			}
		})
	}
}

// The mediator's own user is an operator too: a mediator run as uid 7777
// lets uid 7777 act as any tenant, and root still, while the mapping holds
// for everyone else.
func TestHostAccessMediatorUser(t *testing.T) {
	dir := hostDir(t)
	quota := filepath.Join(dir, "tenants.toml")
	if err := os.WriteFile(quota, []byte(hostQuota), 0o644); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(dir, "own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, 7777, 7777); err != nil {
		t.Fatal(err)
	}
	socket := startHostMediator(t, own, as(7777, 7777), "--quota", quota)
	for _, cred := range []*syscall.Credential{as(7777, 7777), nil} {
		if out, code := runCred(t, cred, "tenantdial", "--socket", socket, "--tenant", "bob"); code != 0 {
			t.Errorf("%+v as bob: exit %d\n%s", cred, code, out)
		}
	}
	if out, code := runCred(t, as(4242, 4242), "tenantdial", "--socket", socket, "--tenant", "bob"); code != 3 || !strings.Contains(out, `uid 4242 (groups 4242) may not act as tenant "bob"`) {
		t.Errorf("uid 4242 as bob: exit %d, want 3 (permission denied)\n%s", code, out)
	}
}

// Bad --socket-mode and --socket-group values stop the mediator at start
// (exit 2), naming the value.
func TestHostAccessSocketFlags(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "m.sock")
	for _, flags := range [][]string{
		{"--socket-mode", "999"},
		{"--socket-mode", "01777"},
		{"--socket-mode", "rw-rw----"},
		{"--socket-group", "no-such-group-vgpu"},
		{"--socket-group", "4294967295"},
	} {
		out, code := runCred(t, nil, "vgpu-mediator", append([]string{"--socket", socket, "--quota", "", "--state-dir", "", "--containerd", ""}, flags...)...)
		if code != 2 || !strings.Contains(out, flags[0]+` "`+flags[1]+`"`) || !strings.Contains(out, "invalid argument") {
			t.Errorf("%v: exit %d, want 2 and a message naming the value: %s", flags, code, out)
		}
	}
}
