package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// hookBin is vgpu-hook built the way it ships: CGO_ENABLED=0.
var hookBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vgpu-hook-test")
	if err != nil {
		panic(err)
	}
	hookBin = filepath.Join(dir, "vgpu-hook")
	cmd := exec.Command("go", "build", "-o", hookBin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build vgpu-hook: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fakeMediator speaks the operator protocol on a Unix socket, as far as the
// hook and the admission calls need it. The real mediator replaces it in
// the end-to-end tests.
type fakeMediator struct {
	socket string
	ln     net.Listener

	mu         sync.Mutex
	hellos     []api.Hello
	registered []api.Register
	released   []string
	reloads    int
	regErr     error         // answer to Register, if set
	relErr     error         // answer to Release, if set
	hang       chan struct{} // if set, requests after Hello wait for it to close
	drop       int           // connections to close as accepted, before their hello, as a handover does
	dropped    int
}

func startFake(t *testing.T) *fakeMediator {
	t.Helper()
	dir, err := os.MkdirTemp("", "vgpu-fake") // short: a socket path has ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMediator{socket: filepath.Join(dir, "mediator.sock")}
	f.ln, err = net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.mu.Lock()
		if f.hang != nil {
			select {
			case <-f.hang:
			default:
				close(f.hang)
			}
		}
		f.mu.Unlock()
		f.ln.Close()
		os.RemoveAll(dir)
	})
	go func() {
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			drop := f.drop > 0
			if drop {
				f.drop--
				f.dropped++
			}
			f.mu.Unlock()
			if drop {
				c.Close()
				continue
			}
			go f.serve(wire.NewConn(c))
		}
	}()
	return f
}

func (f *fakeMediator) serve(c *wire.Conn) {
	defer c.Close()
	for {
		h, err := c.ReadHeader()
		if err != nil {
			return
		}
		body := make([]byte, h.Len)
		if err := c.ReadBody(body); err != nil {
			return
		}
		if h.Op != api.OpHello {
			f.mu.Lock()
			hang := f.hang
			f.mu.Unlock()
			if hang != nil {
				<-hang
			}
		}
		reply, err := f.answer(h.Op, body)
		if err != nil {
			err = c.ReplyError(h, err)
		} else {
			err = c.Reply(h, reply)
		}
		if err != nil {
			return
		}
	}
}

func (f *fakeMediator) answer(op wire.Op, body []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch op {
	case api.OpHello:
		var h api.Hello
		if err := api.Decode(body, &h); err != nil {
			return nil, err
		}
		f.hellos = append(f.hellos, h)
		if h.Magic != api.Magic || h.Version != api.Version || h.Role != api.RoleOperator {
			return nil, fmt.Errorf("hello %+v: %w", h, api.ErrPermissionDenied)
		}
		return api.Encode(&api.HelloReply{Version: api.Version, Session: 1}), nil
	case api.OpRegister:
		var r api.Register
		if err := api.Decode(body, &r); err != nil {
			return nil, err
		}
		f.registered = append(f.registered, r)
		if f.regErr != nil {
			return nil, f.regErr
		}
		return api.Encode(&api.RegisterReply{Tenant: r.Tenant, Memory: r.Memory, Socket: filepath.Join(r.SocketDir, "mediator.sock")}), nil
	case api.OpRelease:
		var r api.Release
		if err := api.Decode(body, &r); err != nil {
			return nil, err
		}
		f.released = append(f.released, r.Namespace+"/"+r.Container)
		return nil, f.relErr
	case api.OpTenants:
		return json.Marshal([]api.TenantInfo{{Name: "team-a", Memory: 8 << 30, Compute: 10, Containers: len(f.registered)}})
	case api.OpReload:
		f.reloads++
		if f.reloads > 1 {
			return nil, fmt.Errorf("quota file /etc/vgpu/quota.toml: tenant %q: memory %q: %w", "team-b", "lots", api.ErrInvalidArgument)
		}
		return nil, nil
	}
	return nil, fmt.Errorf("%v is not an operator operation: %w", op, api.ErrPermissionDenied)
}

// container is a bundle with a root filesystem, a state directory holding
// the container's socket directory, and the hook's configuration for it.
type container struct {
	cfg   runtimehook.HookConfig
	state specs.State
}

func newContainer(t *testing.T, f *fakeMediator, stage runtimehook.HookStage) *container {
	t.Helper()
	b := t.TempDir()
	os.MkdirAll(filepath.Join(b, "rootfs", "run"), 0o755)
	if err := os.WriteFile(filepath.Join(b, "config.json"), []byte(`{"ociVersion":"1.0.2","root":{"path":"rootfs"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "containers")
	dir, err := runtimehook.PrepareSocketDir(stateDir, "moby", "ctr1")
	if err != nil {
		t.Fatal(err)
	}
	return &container{
		cfg: runtimehook.HookConfig{Stage: stage, Socket: f.socket, Namespace: "moby", Tenant: "team-a",
			Memory: 2 << 30, Compute: 4, Devices: 1, SocketDir: dir, StateDir: stateDir},
		state: specs.State{Version: specs.Version, ID: "ctr1", Status: specs.StateCreating, Pid: 31337, Bundle: b},
	}
}

// hostileEnv is what a container's image might try to smuggle into a hook.
var hostileEnv = []string{
	"LD_PRELOAD=/nonexistent/libevil.so", "LD_LIBRARY_PATH=/nonexistent",
	"VGPU_TENANT=root", "VGPU_SOCKET=/tmp/evil.sock", "PATH=/nonexistent",
}

// runHook runs the built hook as runc would, with the spec's arguments and
// the state on stdin.
func runHook(t *testing.T, c *container, env []string) (code int, stderr string) {
	t.Helper()
	st, _ := json.Marshal(c.state)
	args := c.cfg.Args()
	cmd := exec.Command(hookBin, args[1:]...)
	cmd.Args[0] = args[0]
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(st)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), errb.String()
	}
	t.Fatalf("run vgpu-hook: %v", err)
	return -1, ""
}

func TestHookIsStatic(t *testing.T) {
	f, err := elf.Open(hookBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("vgpu-hook has a program interpreter: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Fatalf("vgpu-hook needs shared libraries %q", libs)
	}
}

func TestHookRegisters(t *testing.T) {
	f := startFake(t)
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	code, stderr := runHook(t, c, append(hostileEnv, runtimehook.HookEnv...))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := api.Register{Container: "ctr1", Namespace: "moby", Tenant: "team-a", Memory: 2 << 30, Compute: 4, Devices: 1,
		Pid: 31337, SocketDir: c.cfg.SocketDir}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !reflect.DeepEqual(f.registered, []api.Register{want}) {
		t.Fatalf("registered %+v, want %+v", f.registered, want)
	}
	if len(f.hellos) != 1 || f.hellos[0].Tenant != "" {
		t.Fatalf("hellos %+v: the hook must connect as an operator naming no tenant", f.hellos)
	}
}

// TestHookRegistersAcrossAHandover: a mediator handing over to its
// successor closes the connections it accepted, before their hello too;
// the hook connects again and registers the container once. A socket that
// nobody listens on fails at once.
func TestHookRegistersAcrossAHandover(t *testing.T) {
	f := startFake(t)
	f.mu.Lock() // its accept loop runs already
	f.drop = 2
	f.mu.Unlock()
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	code, stderr := runHook(t, c, nil)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	f.mu.Lock()
	dropped, registered := f.dropped, len(f.registered)
	f.mu.Unlock()
	if dropped != 2 || registered != 1 {
		t.Fatalf("%d connections dropped before their hello, %d registrations; want 2 dropped, then 1 registration", dropped, registered)
	}
	f.ln.Close()
	start := time.Now()
	if code, stderr := runHook(t, newContainer(t, f, runtimehook.StageCreateRuntime), nil); code == 0 || !strings.Contains(stderr, "connect to mediator") {
		t.Fatalf("no listener: exit %d, stderr %q; want a failure to connect", code, stderr)
	}
	if d := time.Since(start); d > runtimehook.HookDeadline/2 {
		t.Fatalf("no listener: gave up after %v, want at once", d)
	}
}

func TestHookRegisterRefused(t *testing.T) {
	f := startFake(t)
	f.regErr = fmt.Errorf("tenant %q: 2.0 GiB asked, 1.5 GiB of 8.0 GiB left: %w", "team-a", api.ErrQuotaExceeded)
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	code, stderr := runHook(t, c, runtimehook.HookEnv)
	if code == 0 {
		t.Fatalf("exit 0 on a refused admission; stderr %q", stderr)
	}
	for _, part := range []string{"vgpu-hook: ", "register container ctr1", f.regErr.Error()} {
		if !strings.Contains(stderr, part) {
			t.Errorf("stderr %q lacks %q", stderr, part)
		}
	}
	// The mediator's reason is the first line, for vgpu-runtime to find in
	// runc's error and show first.
	if first, _, _ := strings.Cut(stderr, "\n"); first != "vgpu-hook: the mediator refused the container: "+f.regErr.Error() {
		t.Errorf("first line %q; want the mediator's reason", first)
	}
	if _, err := os.Lstat(c.cfg.SocketDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory left after a refusal: %v", err)
	}
}

func TestHookRefusesSymlinkedMountPoint(t *testing.T) {
	f := startFake(t)
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	run := filepath.Join(c.state.Bundle, "rootfs", "run")
	os.Remove(run)
	os.Symlink("/etc", run)
	code, stderr := runHook(t, c, runtimehook.HookEnv)
	if code == 0 || !strings.Contains(stderr, "symlink") {
		t.Fatalf("exit %d, stderr %q; want a refusal", code, stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.registered) != 0 {
		t.Fatal("registered a container whose mount point is a symlink")
	}
}

func TestHookPoststop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		relErr error
		code   int
		stderr string
	}{
		{"released", nil, 0, ""},
		{"unknown container", fmt.Errorf("container %q is not registered: %w", "ctr1", api.ErrInvalidArgument), 0, "is not registered"},
		{"refused", fmt.Errorf("release needs a peer running as root: %w", api.ErrPermissionDenied), 1, "release needs a peer running as root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t)
			f.relErr = tc.relErr
			c := newContainer(t, f, runtimehook.StagePoststop)
			c.state.Status, c.state.Pid = specs.StateStopped, 0
			code, stderr := runHook(t, c, hostileEnv)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr, tc.code, tc.stderr)
			}
			f.mu.Lock()
			released := f.released
			f.mu.Unlock()
			if !reflect.DeepEqual(released, []string{"moby/ctr1"}) {
				t.Fatalf("released %q", released)
			}
			if _, err := os.Lstat(c.cfg.SocketDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket directory left: %v", err)
			}
		})
	}
}

func TestHookPoststopWithoutMediator(t *testing.T) {
	f := startFake(t)
	c := newContainer(t, f, runtimehook.StagePoststop)
	f.ln.Close()
	if code, stderr := runHook(t, c, nil); code != 0 || !strings.Contains(stderr, "ignored") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	c.cfg.Stage = runtimehook.StageCreateRuntime
	if code, stderr := runHook(t, c, nil); code == 0 || !strings.Contains(stderr, "unavailable") {
		t.Fatalf("createRuntime without a mediator: exit %d, stderr %q", code, stderr)
	}
}

func TestHookBadInput(t *testing.T) {
	f := startFake(t)
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
	}{
		{"no arguments", nil, ""},
		{"bad stage", []string{"prestart"}, ""},
		{"garbage state", c.cfg.Args()[1:], "{not json"},
		{"hostile id in state", c.cfg.Args()[1:], `{"id":"../../etc","pid":1,"bundle":"/"}`},
		{"another container's state", c.cfg.Args()[1:], fmt.Sprintf(`{"id":"ctr2","pid":1,"bundle":%q}`, c.state.Bundle)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(hookBin, tc.args...)
			cmd.Stdin = strings.NewReader(tc.stdin)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 || !strings.HasPrefix(string(out), "vgpu-hook: ") {
				t.Fatalf("err %v, output %q", err, out)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.registered) != 0 {
		t.Fatalf("registered %+v", f.registered)
	}
}

// TestHookGivesUp: a mediator that accepts and never answers does not hold
// the container's creation past the hook's deadline.
func TestHookGivesUp(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the hook's deadline")
	}
	t.Parallel()
	f := startFake(t)
	f.hang = make(chan struct{})
	c := newContainer(t, f, runtimehook.StageCreateRuntime)
	start := time.Now()
	code, stderr := runHook(t, c, nil)
	d := time.Since(start)
	if code == 0 || !strings.Contains(stderr, "in time") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if d < runtimehook.HookDeadline-time.Second || d > time.Duration(runtimehook.HookTimeout)*time.Second {
		t.Fatalf("gave up after %v; deadline %v, runc's timeout %ds", d, runtimehook.HookDeadline, runtimehook.HookTimeout)
	}
}

// TestOperatorAdmission covers client.Operator's admission calls against
// the fake mediator.
func TestOperatorAdmission(t *testing.T) {
	f := startFake(t)
	o, err := client.DialOperator(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	reg := api.Register{Container: "c9", Namespace: "k8s.io", Memory: 1 << 30, Devices: 1, Pid: 7, SocketDir: "/run/vgpu/containers/k8s.io/c9"}
	reply, err := o.Register(reg)
	if err != nil || reply.Socket != "/run/vgpu/containers/k8s.io/c9/mediator.sock" || reply.Memory != 1<<30 {
		t.Fatalf("Register = %+v, %v", reply, err)
	}
	f.mu.Lock()
	f.regErr = fmt.Errorf("tenant %q: 3 containers, limit 3: %w", "team-a", api.ErrQuotaExceeded)
	f.mu.Unlock()
	if _, err := o.Register(reg); !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "limit 3") {
		t.Fatalf("refused Register: %v", err)
	}
	if err := o.Release("k8s.io", "c9"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	f.mu.Lock()
	f.relErr = fmt.Errorf("container %q is not registered: %w", "zz", api.ErrInvalidArgument)
	f.mu.Unlock()
	if err := o.Release("", "zz"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Release of an unknown container: %v", err)
	}
	ts, err := o.Tenants()
	if err != nil || len(ts) != 1 || ts[0].Name != "team-a" || ts[0].Memory != 8<<30 || ts[0].Containers != 2 {
		t.Fatalf("Tenants = %+v, %v", ts, err)
	}
	if err := o.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if err := o.Reload(); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "quota.toml") {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !reflect.DeepEqual(f.released, []string{"k8s.io/c9", "/zz"}) {
		t.Fatalf("released %q", f.released)
	}
}
