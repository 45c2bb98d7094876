package root

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ociRuntime drives an OCI runtime the way containerd's shim drives runc:
// argv (the runtime and its own flags), then --root, then the command.
type ociRuntime struct {
	argv   []string
	root   string // runc --root
	bundle string
	logs   string // directory for each call's stdout and stderr
	calls  int
}

// call runs one command of the runtime. Output goes to files, not pipes: a
// container created by "create" inherits them and outlives the call.
func (r *ociRuntime) call(tb testing.TB, args ...string) (stdout, stderr string, code int) {
	tb.Helper()
	r.calls++
	outPath := filepath.Join(r.logs, fmt.Sprintf("%02d.out", r.calls))
	errPath := filepath.Join(r.logs, fmt.Sprintf("%02d.err", r.calls))
	outF, err := os.Create(outPath)
	if err != nil {
		tb.Fatal(err)
	}
	errF, err := os.Create(errPath)
	if err != nil {
		tb.Fatal(err)
	}
	argv := append(append(slices.Clone(r.argv[1:]), "--root", r.root), args...)
	cmd := exec.Command(r.argv[0], argv...)
	cmd.Stdout, cmd.Stderr = outF, errF
	cmd.Dir = r.bundle
	err = cmd.Start()
	outF.Close()
	errF.Close()
	if err != nil {
		tb.Fatalf("%s: %v", r.argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done: // the exit code is all we need
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		tb.Fatalf("%s %s: no answer within a minute", r.argv[0], strings.Join(args, " "))
	}
	o, _ := os.ReadFile(outPath)
	e, _ := os.ReadFile(errPath)
	code = cmd.ProcessState.ExitCode()
	return string(o), string(e), code
}

var logTime = regexp.MustCompile(`time="[^"]*" `)

// norm makes output comparable between runtimes: the runtime's own paths
// and log timestamps go.
func (r *ociRuntime) norm(s string) string {
	s = strings.ReplaceAll(s, r.bundle, "<bundle>")
	s = strings.ReplaceAll(s, r.root, "<root>")
	s = logTime.ReplaceAllString(s, "")
	return strings.TrimSpace(s)
}

// state is "runc state" without what differs from run to run.
func (r *ociRuntime) state(tb testing.TB, id string) string {
	tb.Helper()
	out, errOut, code := r.call(tb, "state", id)
	if code != 0 {
		return fmt.Sprintf("state: exit %d: %s", code, r.norm(errOut))
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		tb.Fatalf("state JSON: %v\n%s", err, out)
	}
	pid, _ := st["pid"].(float64)
	st["pid"] = pid > 0
	delete(st, "created")
	b, _ := json.Marshal(st)
	return "state: " + r.norm(string(b))
}

// newBundle writes a bundle for a runtime under dir: the image's rootfs
// and a config.json from the runtime's own "spec" command, edited by edit.
func (h *harness) newBundle(tb testing.TB, r *ociRuntime, edit func(*specs.Spec)) (specOut string) {
	tb.Helper()
	if err := cloneTree(filepath.Join(r.bundle, "rootfs"), h.rootfs); err != nil {
		tb.Fatalf("bundle rootfs: %v", err)
	}
	if _, errOut, code := r.call(tb, "spec", "--bundle", r.bundle); code != 0 {
		tb.Fatalf("%s spec: exit %d: %s", r.argv[0], code, errOut)
	}
	path := filepath.Join(r.bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		tb.Fatalf("generated config.json: %v", err)
	}
	s.Process.Terminal = false
	s.Process.Args = []string{"sleep", "300"}
	s.Hostname = "e2e"
	if edit != nil {
		edit(&s)
	}
	b, _ := json.MarshalIndent(&s, "", "\t")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	return string(raw)
}

// newRuntime sets up a runtime's private root, bundle and log directories.
func (h *harness) newRuntime(tb testing.TB, name string, argv []string) *ociRuntime {
	tb.Helper()
	r := &ociRuntime{
		argv:   argv,
		root:   filepath.Join(h.runcRoots, name),
		bundle: filepath.Join(h.dir, "bundles", name),
		logs:   filepath.Join(h.dir, "calls", name),
	}
	for _, d := range []string{r.root, r.bundle, r.logs} {
		os.RemoveAll(d)
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		out, _, _ := r.call(tb, "list", "-q")
		for _, id := range lines(out) {
			exec.Command(h.runc, "--root", r.root, "delete", "--force", id).Run()
		}
		os.RemoveAll(r.bundle)
	})
	return r
}

// lifecycle drives a container through the whole of runc's lifecycle and
// returns the transcript, normalized; config.json is compared before and
// after create (a container that asks for nothing must keep it byte for
// byte).
func (h *harness) lifecycle(tb testing.TB, r *ociRuntime) []string {
	tb.Helper()
	const id = "e2e-lifecycle"
	var tr []string
	step := func(name, out, errOut string, code int) {
		tr = append(tr, fmt.Sprintf("%s: exit %d; stdout %q; stderr %q", name, code, r.norm(out), r.norm(errOut)))
	}
	spec := h.newBundle(tb, r, nil)
	tr = append(tr, fmt.Sprintf("spec: config.json of %d bytes, sha256 %x", len(spec), sha256.Sum256([]byte(spec))))
	before, _ := os.ReadFile(filepath.Join(r.bundle, "config.json"))

	o, e, c := r.call(tb, "create", "--bundle", r.bundle, "--pid-file", filepath.Join(r.bundle, "pid"), id)
	step("create", o, e, c)
	after, _ := os.ReadFile(filepath.Join(r.bundle, "config.json"))
	tr = append(tr, fmt.Sprintf("config.json unchanged by create: %v", bytes.Equal(before, after)))
	tr = append(tr, r.state(tb, id))
	o, e, c = r.call(tb, "list")
	step("list", listRows(o), e, c)
	o, e, c = r.call(tb, "start", id)
	step("start", o, e, c)
	tr = append(tr, r.state(tb, id))

	o, e, c = r.call(tb, "exec", id, "echo", "hello")
	step("exec echo", o, e, c)
	o, e, c = r.call(tb, "exec", "--env", "FOO=bar", "--cwd", "/tmp", id, "/bin/sh", "-c", `echo "$FOO $(pwd)"; ls /run/vgpu; echo "ls: $?"; echo "socket: $VGPU_SOCKET"`)
	step("exec sh", o, e, c)
	o, e, c = r.call(tb, "exec", id, "/bin/sh", "-c", "exit 3")
	step("exec exit 3", o, e, c)
	o, e, c = r.call(tb, "ps", id)
	step("ps", psRows(o), e, c)
	o, e, c = r.call(tb, "ps", "--format", "json", id)
	var pids []int
	json.Unmarshal([]byte(o), &pids)
	step("ps json", fmt.Sprintf("%d pids", len(pids)), e, c)

	o, e, c = r.call(tb, "pause", id)
	step("pause", o, e, c)
	tr = append(tr, r.state(tb, id))
	o, e, c = r.call(tb, "resume", id)
	step("resume", o, e, c)
	tr = append(tr, r.state(tb, id))

	o, e, c = r.call(tb, "kill", id, "KILL")
	step("kill", o, e, c)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.state(tb, id), `"status":"stopped"`) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	tr = append(tr, r.state(tb, id))
	o, e, c = r.call(tb, "delete", id)
	step("delete", o, e, c)
	tr = append(tr, r.state(tb, id))
	o, e, c = r.call(tb, "list")
	step("list", listRows(o), e, c)
	o, e, c = r.call(tb, "start", "no-such-container")
	step("start missing", o, e, c)
	o, e, c = r.call(tb, "kill", "no-such-container", "TERM")
	step("kill missing", o, e, c)
	o, e, c = r.call(tb, "no-such-command")
	step("unknown command", o, e, c)
	return tr
}

// listRows keeps what "runc list" says that does not change between runs:
// the header, and id, status and owner of each row.
func listRows(out string) string {
	var rows []string
	for i, l := range lines(out) {
		f := strings.Fields(l)
		if i == 0 || len(f) < 6 {
			rows = append(rows, strings.Join(f, " "))
			continue
		}
		rows = append(rows, strings.Join([]string{f[0], f[2], f[len(f)-1]}, " "))
	}
	return strings.Join(rows, "\n")
}

// psRows keeps the header and each process's user and command.
func psRows(out string) string {
	var rows []string
	for i, l := range lines(out) {
		f := strings.Fields(l)
		if i == 0 || len(f) < 8 {
			rows = append(rows, strings.Join(f, " "))
			continue
		}
		rows = append(rows, f[0]+" "+strings.Join(f[7:], " "))
	}
	return strings.Join(rows, "\n")
}

// Issue test 6: vgpu-runtime passes runc's own lifecycle through untouched.
// Driven directly, as containerd's shim drives runc (a bundle with a
// busybox rootfs and a config.json from "spec"): spec, create, state,
// list, start, exec, ps, pause, resume, kill, delete and error cases give
// the same transcript as plain runc, and create leaves config.json byte
// for byte as it was.
func TestRuntimePassesRuncLifecycleThrough(t *testing.T) {
	h := env(t)
	base := h.lifecycle(t, h.newRuntime(t, "plain", []string{h.runc}))
	for _, want := range []string{
		`create: exit 0`, `"status":"created"`, `"status":"running"`, `exec echo: exit 0; stdout "hello"`,
		`"status":"paused"`, `"status":"stopped"`, `delete: exit 0`, `config.json unchanged by create: true`,
	} {
		if !strings.Contains(strings.Join(base, "\n"), want) {
			t.Fatalf("plain runc baseline lacks %q; transcript:\n%s", want, strings.Join(base, "\n"))
		}
	}
	t.Logf("plain runc transcript:\n%s", strings.Join(base, "\n"))
	needRuntime(t, h)
	got := h.lifecycle(t, h.newRuntime(t, "vgpu", append([]string{h.binPath("vgpu-runtime")}, h.runtimeArgs()...)))
	if !slices.Equal(got, base) {
		var diff []string
		for i := range max(len(got), len(base)) {
			var g, b string
			if i < len(got) {
				g = got[i]
			}
			if i < len(base) {
				b = base[i]
			}
			if g != b {
				diff = append(diff, fmt.Sprintf("runc: %s\nvgpu: %s", b, g))
			}
		}
		t.Fatalf("vgpu-runtime differs from runc at %d steps:\n%s", len(diff), strings.Join(diff, "\n\n"))
	}
	_, err := os.Lstat(filepath.Join(h.ctrDir, "vgpu")) // the namespace: runc --root's base name
	if left := containerDirs(h.ctrDir); len(left) > 0 || err == nil {
		t.Errorf("vgpu-runtime left state for a container without a request in %s: %v (namespace directory: %v)", h.ctrDir, left, err)
	}
}

// The other half of test 6: driven directly, vgpu-runtime attaches a
// bundle that asks for a vGPU (VGPU_MEMORY in its process environment):
// create adds the hooks, the /run/vgpu mount and VGPU_SOCKET, the hook
// registers it for the tenant of --vgpu-tenant, a program exec'd in it
// computes on its vGPU, and delete releases everything.
func TestRuntimeAttachesARequestingBundle(t *testing.T) {
	h := vgpuEnv(t)
	const id = "e2e-request"
	r := h.newRuntime(t, "request", append([]string{h.binPath("vgpu-runtime"), "--vgpu-tenant", "team-b"}, h.runtimeArgs()...))
	h.newBundle(t, r, func(s *specs.Spec) { s.Process.Env = append(s.Process.Env, "VGPU_MEMORY=64MiB") })
	if _, e, c := r.call(t, "create", "--bundle", r.bundle, id); c != 0 {
		t.Fatalf("create: exit %d: %s", c, e)
	}
	raw, err := os.ReadFile(filepath.Join(r.bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("config.json after create: %v", err)
	}
	if !slices.Contains(s.Process.Env, "VGPU_SOCKET=/run/vgpu/mediator.sock") {
		t.Errorf("process env after create lacks VGPU_SOCKET=/run/vgpu/mediator.sock: %q", s.Process.Env)
	}
	if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool {
		return m.Destination == "/run/vgpu" && m.Source == filepath.Join(h.ctrDir, "request", id) // namespace: runc --root's base name
	}) {
		t.Errorf("no mount of %s at /run/vgpu after create: %+v", filepath.Join(h.ctrDir, "request", id), s.Mounts)
	}
	hookPath := func(hs []specs.Hook) bool {
		return slices.ContainsFunc(hs, func(hk specs.Hook) bool { return hk.Path == h.binPath("vgpu-hook") })
	}
	if s.Hooks == nil || !hookPath(s.Hooks.CreateRuntime) || !hookPath(s.Hooks.Poststop) {
		t.Errorf("no vgpu-hook among the createRuntime and poststop hooks after create: %+v", s.Hooks)
	}
	if tb := tenant(h.tenants(t), "team-b"); tb.Containers != 1 || tb.Reserved != 64<<20 {
		t.Errorf("tenant team-b after create: %d containers, %d bytes reserved; want 1, %d", tb.Containers, tb.Reserved, 64<<20)
	}
	if _, e, c := r.call(t, "start", id); c != 0 {
		t.Fatalf("start: exit %d: %s", c, e)
	}
	o, e, c := r.call(t, "exec", id, "/tenant", "--n", "100000")
	if c != 0 || strings.TrimSpace(o) != "ok" {
		t.Fatalf("exec /tenant: exit %d, stdout %q, stderr %q", c, o, e)
	}
	if _, e, c := r.call(t, "kill", id, "KILL"); c != 0 {
		t.Fatalf("kill: exit %d: %s", c, e)
	}
	waitFor(t, 10*time.Second, "the container to stop", func() bool { return strings.Contains(r.state(t, id), `"status":"stopped"`) })
	if _, e, c := r.call(t, "delete", id); c != 0 {
		t.Fatalf("delete: exit %d: %s", c, e)
	}
	h.waitIdle(t, 10*time.Second, "after delete (poststop hook)")
}
