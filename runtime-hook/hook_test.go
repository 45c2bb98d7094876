package runtimehook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

func TestHookArgsRoundTrip(t *testing.T) {
	for _, c := range []HookConfig{
		{Stage: StageCreateRuntime, Socket: "/run/vgpu/mediator.sock", Namespace: "moby", Tenant: "team-a",
			Memory: 2 << 30, Compute: 7, Devices: 2, SocketDir: "/run/vgpu/containers/moby/abc", StateDir: "/run/vgpu/containers"},
		{Stage: StageCreateRuntime, Socket: "/s", SocketDir: "/st/_/x", StateDir: "/st", Devices: 1},
		{Stage: StageCreateRuntime, Socket: "/s", SocketDir: "/st/_/x", StateDir: "/st", Devices: 1<<32 - 1, Compute: 1<<32 - 1, Memory: 1<<64 - 1},
		{Stage: StagePoststop, Socket: "/run/vgpu/mediator.sock", Namespace: "k8s.io", SocketDir: "/run/vgpu/containers/k8s.io/abc", StateDir: "/run/vgpu/containers"},
		{Stage: StagePoststop, Socket: "/s", SocketDir: "/st/_/x", StateDir: "/st"},
	} {
		got, err := ParseHookArgs(c.Args())
		if err != nil {
			t.Fatalf("ParseHookArgs(%q): %v", c.Args(), err)
		}
		if *got != c {
			t.Fatalf("round trip of %+v gave %+v", c, *got)
		}
	}
}

func TestParseHookArgsErrors(t *testing.T) {
	good := []string{"--socket", "/s", "--socket-dir", "/st/_/c", "--state-dir", "/st"}
	for _, tc := range []struct {
		name string
		argv []string
		msg  string
	}{
		{"no stage", []string{"vgpu-hook"}, "usage"},
		{"bad stage", append([]string{"vgpu-hook", "prestart"}, good...), `"prestart"`},
		{"unknown flag", append([]string{"vgpu-hook", "poststop", "--memory", "1"}, good...), "memory"},
		{"extra argument", append([]string{"vgpu-hook", "poststop"}, append(good, "x")...), `"x"`},
		{"relative socket", []string{"vgpu-hook", "poststop", "--socket", "s", "--socket-dir", "/st/c", "--state-dir", "/st"}, "--socket"},
		{"missing socket dir", []string{"vgpu-hook", "poststop", "--socket", "/s", "--state-dir", "/st"}, "--socket-dir"},
		{"unclean socket dir", []string{"vgpu-hook", "poststop", "--socket", "/s", "--socket-dir", "/st/c/../../etc", "--state-dir", "/st"}, "--socket-dir"},
		{"socket dir elsewhere", []string{"vgpu-hook", "poststop", "--socket", "/s", "--socket-dir", "/etc/c", "--state-dir", "/st"}, "not a container's directory"},
		{"socket dir is the state dir", []string{"vgpu-hook", "poststop", "--socket", "/s", "--socket-dir", "/st", "--state-dir", "/st"}, "not a container's directory"},
		{"socket dir without a namespace", []string{"vgpu-hook", "poststop", "--socket", "/s", "--socket-dir", "/st/c", "--state-dir", "/st"}, "not a container's directory"},
		{"socket dir of another namespace", []string{"vgpu-hook", "poststop", "--namespace", "moby", "--socket", "/s", "--socket-dir", "/st/k8s.io/c", "--state-dir", "/st"},
			`of namespace "moby"`},
		{"bad namespace", []string{"vgpu-hook", "poststop", "--namespace", "..", "--socket", "/s", "--socket-dir", "/st/x/c", "--state-dir", "/st"}, `namespace ".."`},
		{"namespace with a slash", []string{"vgpu-hook", "createRuntime", "--namespace", "a/b", "--socket", "/s", "--socket-dir", "/st/a/b/c", "--state-dir", "/st"}, `namespace "a/b"`},
		{"compute overflow", append([]string{"vgpu-hook", "createRuntime", "--compute", "4294967296"}, good...), "--compute"},
		{"devices not a number", append([]string{"vgpu-hook", "createRuntime", "--devices", "two"}, good...), "devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseHookArgs(tc.argv)
			if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("ParseHookArgs = %+v, %v; want invalid argument naming %q", c, err, tc.msg)
			}
		})
	}
}

func TestReadState(t *testing.T) {
	st, err := ReadState(strings.NewReader(`{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":4242,"bundle":"/b","annotations":{"a":"b"}}`))
	if err != nil || st.ID != "abc" || st.Pid != 4242 || st.Bundle != "/b" {
		t.Fatalf("ReadState = %+v, %v", st, err)
	}
	for _, in := range []string{
		"", "{", `{"id":"../x","pid":1}`, `{"id":"","pid":1}`, `{"id":"a","pid":-1}`, `{"id":"a","pid":99999999999}`,
		`{"id":"a","pid":"1"}`, `{"id":"a"}` + strings.Repeat(" ", maxStateJSON),
	} {
		if st, err := ReadState(strings.NewReader(in)); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("ReadState(%.40q) = %+v, %v", in, st, err)
		}
	}
}

// rootBundle makes a bundle whose config.json has root.path rootPath and
// returns the bundle and the root filesystem's absolute path.
func rootBundle(t *testing.T, rootPath string) (string, string) {
	t.Helper()
	b := t.TempDir()
	if err := os.WriteFile(filepath.Join(b, "config.json"), fmt.Appendf(nil, `{"ociVersion":"1.0.2","root":{"path":%q}}`, rootPath), 0o600); err != nil {
		t.Fatal(err)
	}
	rootfs := rootPath
	if !filepath.IsAbs(rootPath) {
		rootfs = filepath.Join(b, rootPath)
	}
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	return b, rootfs
}

func TestReadBundle(t *testing.T) {
	b, want := rootBundle(t, "rootfs")
	if got, mounts, err := ReadBundle(b); err != nil || got != want || mounts != nil {
		t.Fatalf("relative root: %q, %v, %v; want %q", got, mounts, err, want)
	}
	abs := filepath.Join(t.TempDir(), "merged")
	b, _ = rootBundle(t, abs)
	if got, _, err := ReadBundle(b); err != nil || got != abs {
		t.Fatalf("absolute root: %q, %v", got, err)
	}
	mounted := t.TempDir()
	os.WriteFile(filepath.Join(mounted, "config.json"), []byte(`{"root":{"path":"r"},"mounts":[{"destination":"/run","type":"tmpfs"}]}`), 0o600)
	if _, mounts, err := ReadBundle(mounted); err != nil || len(mounts) != 1 || mounts[0].Destination != "/run" {
		t.Fatalf("mounts: %+v, %v", mounts, err)
	}
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o600)
	big := t.TempDir()
	if f, err := os.Create(filepath.Join(big, "config.json")); err == nil {
		f.Truncate(maxConfigJSON + 1)
		f.Close()
	}
	for _, bad := range []string{empty, t.TempDir(), big} {
		if _, _, err := ReadBundle(bad); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("ReadBundle(%s): %v", bad, err)
		}
	}
	if _, _, err := ReadBundle(big); !strings.Contains(fmt.Sprint(err), fmt.Sprint(maxConfigJSON)) {
		t.Errorf("ReadBundle of a large config.json: %v; want the bound named", err)
	}
}

func TestCheckMountPoint(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, rootfs string)
		ok    bool
	}{
		{"nothing there yet", func(*testing.T, string) {}, true},
		{"plain directories", func(t *testing.T, r string) { os.MkdirAll(filepath.Join(r, "run", "vgpu"), 0o755) }, true},
		{"/run a symlink out", func(t *testing.T, r string) { os.Symlink("/etc", filepath.Join(r, "run")) }, false},
		{"/run a relative symlink up", func(t *testing.T, r string) { os.Symlink("../../../../../../etc", filepath.Join(r, "run")) }, false},
		{"/run/vgpu a symlink within", func(t *testing.T, r string) {
			os.MkdirAll(filepath.Join(r, "run"), 0o755)
			os.MkdirAll(filepath.Join(r, "etc"), 0o755)
			os.Symlink("/etc", filepath.Join(r, "run", "vgpu"))
		}, false},
		{"/run/vgpu a dangling symlink", func(t *testing.T, r string) {
			os.MkdirAll(filepath.Join(r, "run"), 0o755)
			os.Symlink("/nowhere", filepath.Join(r, "run", "vgpu"))
		}, false},
		{"/run a symlink loop", func(t *testing.T, r string) { os.Symlink("run", filepath.Join(r, "run")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := filepath.Join(t.TempDir(), "rootfs")
			os.MkdirAll(rootfs, 0o755)
			tc.setup(t, rootfs)
			err := CheckMountPoint(rootfs, nil)
			if tc.ok != (err == nil) {
				t.Fatalf("CheckMountPoint = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, api.ErrPermissionDenied) {
				t.Fatalf("error %q is not permission-denied", err)
			}
		})
	}
}

// fakeMediator records calls and answers them as told.
type fakeMediator struct {
	mu         sync.Mutex
	registered []api.Register
	released   []string
	closed     int
	regErr     error
	relErr     error
	block      chan struct{} // if set, calls wait for it
}

func (f *fakeMediator) wait() {
	if f.block != nil {
		<-f.block
	}
}

func (f *fakeMediator) Register(r api.Register) (*api.RegisterReply, error) {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registered = append(f.registered, r)
	if f.regErr != nil {
		return nil, f.regErr
	}
	return &api.RegisterReply{Tenant: r.Tenant, Memory: r.Memory, Socket: filepath.Join(r.SocketDir, vocab.SocketName)}, nil
}

func (f *fakeMediator) Release(ns, c string) error {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, ns+"/"+c)
	return f.relErr
}

func (f *fakeMediator) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	if f.block != nil {
		select {
		case <-f.block:
		default:
			close(f.block) // a closed connection fails its calls
		}
	}
	return nil
}

func (f *fakeMediator) dialer(socket *string) Dialer {
	return func(s string) (Mediator, error) {
		*socket = s
		return f, nil
	}
}

// hookSetup makes a bundle with a root filesystem, a state directory with
// the container's socket directory, and the hook's configuration.
func hookSetup(t *testing.T, stage HookStage) (*HookConfig, *specs.State) {
	t.Helper()
	b, _ := rootBundle(t, "rootfs")
	state := filepath.Join(t.TempDir(), "containers")
	dir, err := PrepareSocketDir(state, "moby", "abc")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &HookConfig{Stage: stage, Socket: "/run/vgpu/mediator.sock", Namespace: "moby", Tenant: "team-a",
		Memory: 1 << 30, Compute: 3, Devices: 2, SocketDir: dir, StateDir: state}
	return cfg, &specs.State{ID: "abc", Pid: 4242, Bundle: b, Status: specs.StateCreating}
}

func TestRunHookRegister(t *testing.T) {
	cfg, st := hookSetup(t, StageCreateRuntime)
	f := &fakeMediator{}
	var socket string
	var log bytes.Buffer
	if err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &log); err != nil {
		t.Fatalf("RunHook: %v", err)
	}
	want := api.Register{Container: "abc", Namespace: "moby", Tenant: "team-a", Memory: 1 << 30, Compute: 3, Devices: 2,
		Pid: 4242, SocketDir: cfg.SocketDir}
	if socket != cfg.Socket || len(f.registered) != 1 || f.registered[0] != want || f.closed != 1 {
		t.Fatalf("dialled %q, registered %+v, closed %d", socket, f.registered, f.closed)
	}
	if !strings.Contains(log.String(), "abc registered") {
		t.Errorf("log %q", log.String())
	}
	if _, err := os.Stat(cfg.SocketDir); err != nil {
		t.Errorf("socket directory gone after a registration: %v", err)
	}
}

func TestRunHookRegisterRefused(t *testing.T) {
	cfg, st := hookSetup(t, StageCreateRuntime)
	refusal := &api.RemoteError{Code: api.CodeQuotaExceeded, Msg: `tenant "team-a": 1.0 GiB asked, 512.0 MiB left of 4.0 GiB: quota exceeded`}
	f := &fakeMediator{regErr: refusal}
	var socket string
	err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &bytes.Buffer{})
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), refusal.Msg) || !strings.Contains(err.Error(), "abc") {
		t.Fatalf("RunHook = %v; want the mediator's refusal", err)
	}
	if _, err := os.Lstat(cfg.SocketDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory left after a refusal: %v", err)
	}
}

func TestRunHookRegisterChecksTheImage(t *testing.T) {
	cfg, st := hookSetup(t, StageCreateRuntime)
	rootfs, _, _ := ReadBundle(st.Bundle)
	os.Symlink("/etc", filepath.Join(rootfs, "run"))
	f := &fakeMediator{}
	var socket string
	err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &bytes.Buffer{})
	if !errors.Is(err, api.ErrPermissionDenied) || len(f.registered) != 0 {
		t.Fatalf("RunHook = %v, registered %v; want a refusal before registering", err, f.registered)
	}
}

// The mount point is checked in the final mount tree as far as the spec
// decides it: a spec mount above /run/vgpu (at /run, or at a path the
// image's symlinks lead there) whose contents come from elsewhere could
// hold a vgpu of its own and is refused, naming it; a fresh tmpfs there
// (containerd's default /run) and mounts beside it are fine.
func TestRunHookRegisterChecksCoveringMounts(t *testing.T) {
	volume := specs.Mount{Destination: "/run", Type: "bind", Source: "/var/lib/docker/volumes/v/_data", Options: []string{"rbind"}}
	for _, tc := range []struct {
		name   string
		mounts []specs.Mount
		image  func(rootfs string)
		refuse string // the destination the refusal names; "" for none
	}{
		{"containerd's default /run tmpfs", []specs.Mount{{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}}}, nil, ""},
		{"a mount beside it", []specs.Mount{{Destination: "/run/secrets", Type: "bind", Source: "/s", Options: []string{"rbind", "ro"}}}, nil, ""},
		{"kubernetes' service account through /var/run", []specs.Mount{{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: "/s", Options: []string{"rbind", "ro"}}},
			func(r string) {
				os.MkdirAll(filepath.Join(r, "var"), 0o755)
				os.Symlink("../run", filepath.Join(r, "var", "run"))
			}, ""},
		{"a volume at /run", []specs.Mount{volume}, nil, "/run"},
		{"a volume at /run/", []specs.Mount{{Destination: "/run/", Type: "none", Source: "/v", Options: []string{"bind"}}}, nil, "/run/"},
		{"a tmpfs bound from elsewhere", []specs.Mount{{Destination: "/run", Type: "tmpfs", Source: "/v", Options: []string{"bind"}}}, nil, "/run"},
		{"a volume at /", []specs.Mount{{Destination: "/", Type: "bind", Source: "/v", Options: []string{"rbind"}}}, nil, "/"},
		{"a volume at /var/run, a symlink to /run", []specs.Mount{{Destination: "/var/run", Type: "bind", Source: "/v", Options: []string{"rbind"}}},
			func(r string) {
				os.MkdirAll(filepath.Join(r, "var"), 0o755)
				os.Symlink("/run", filepath.Join(r, "var", "run"))
			}, "/var/run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, st := hookSetup(t, StageCreateRuntime)
			rootfs := filepath.Join(st.Bundle, "rootfs")
			if tc.image != nil {
				tc.image(rootfs)
			}
			spec := specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "rootfs"},
				Mounts: append(tc.mounts, specs.Mount{Destination: vocab.InContainerSocketDir, Type: "bind", Source: cfg.SocketDir, Options: SocketMountOptions})}
			b, _ := json.Marshal(spec)
			if err := os.WriteFile(filepath.Join(st.Bundle, "config.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			f := &fakeMediator{}
			var socket string
			err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &bytes.Buffer{})
			if tc.refuse == "" {
				if err != nil || len(f.registered) != 1 {
					t.Fatalf("RunHook = %v, registered %v", err, f.registered)
				}
				return
			}
			if !errors.Is(err, api.ErrPermissionDenied) || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("%q", tc.refuse)) || len(f.registered) != 0 {
				t.Fatalf("RunHook = %v, registered %v; want a refusal naming mount %q", err, f.registered, tc.refuse)
			}
		})
	}
}

func TestRunHookOtherContainersDir(t *testing.T) {
	for _, stage := range []HookStage{StageCreateRuntime, StagePoststop} {
		cfg, st := hookSetup(t, stage)
		st.ID = "other"
		f := &fakeMediator{}
		var socket string
		if err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &bytes.Buffer{}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Fatalf("%s: RunHook = %v", stage, err)
		}
		if len(f.registered)+len(f.released) != 0 {
			t.Fatalf("%s: the mediator was called", stage)
		}
		if _, err := os.Stat(cfg.SocketDir); err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
	}
}

func TestRunHookPoststop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		relErr error
		ok     bool
		log    string
	}{
		{"released", nil, true, "abc released"},
		{"unknown container", &api.RemoteError{Code: api.CodeInvalidArgument, Msg: `container "abc" is not registered: invalid argument`}, true, "not registered"},
		{"mediator down", fmt.Errorf("connect: %w", api.ErrUnavailable), true, "ignored"},
		{"refused", &api.RemoteError{Code: api.CodePermissionDenied, Msg: "release needs root"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, st := hookSetup(t, StagePoststop)
			st.Status, st.Pid = specs.StateStopped, 0
			f := &fakeMediator{relErr: tc.relErr}
			var socket string
			var log bytes.Buffer
			err := RunHook(context.Background(), cfg, st, f.dialer(&socket), &log)
			if tc.ok != (err == nil) {
				t.Fatalf("RunHook = %v, want ok=%v", err, tc.ok)
			}
			if !reflect.DeepEqual(f.released, []string{"moby/abc"}) {
				t.Fatalf("released %q", f.released)
			}
			if !strings.Contains(log.String(), tc.log) {
				t.Errorf("log %q lacks %q", log.String(), tc.log)
			}
			if _, err := os.Lstat(cfg.SocketDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket directory left: %v", err)
			}
		})
	}
}

func TestRunHookDialFails(t *testing.T) {
	cfg, st := hookSetup(t, StageCreateRuntime)
	dial := func(string) (Mediator, error) { return nil, fmt.Errorf("connect to mediator: %w", api.ErrUnavailable) }
	if err := RunHook(context.Background(), cfg, st, dial, &bytes.Buffer{}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("register without a mediator: %v", err)
	}
	cfg.Stage = StagePoststop
	if err := RunHook(context.Background(), cfg, st, dial, &bytes.Buffer{}); err != nil {
		t.Fatalf("poststop without a mediator: %v", err)
	}
}

func TestRunHookTimesOut(t *testing.T) {
	cfg, st := hookSetup(t, StageCreateRuntime)
	f := &fakeMediator{block: make(chan struct{})}
	var socket string
	// Long enough that the dial is done before the deadline on a slow
	// machine, so that the register is what times out.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := RunHook(ctx, cfg, st, f.dialer(&socket), &bytes.Buffer{})
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer in time") {
		t.Fatalf("RunHook = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	waitClosed(t, f, "timed-out connection")

	// A dial that hangs past the deadline: the late connection is closed.
	release := make(chan struct{})
	late := &fakeMediator{}
	dialled := make(chan struct{})
	slow := func(string) (Mediator, error) {
		<-release
		defer close(dialled)
		return late, nil
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := RunHook(ctx2, cfg, st, slow, &bytes.Buffer{}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("RunHook with a hanging dial = %v", err)
	}
	close(release)
	<-dialled
	if r := waitClosed(t, late, "late connection"); r != 0 {
		t.Fatalf("late connection: registered %d containers", r)
	}
}

// waitClosed waits for f's connection to be closed once, and returns how
// many containers were registered through it.
func waitClosed(t *testing.T, f *fakeMediator, what string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		c, r := f.closed, len(f.registered)
		f.mu.Unlock()
		if c == 1 {
			return r
		}
		if c > 1 || time.Now().After(deadline) {
			t.Fatalf("%s: closed %d times, want 1", what, c)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRemoveSocketDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "containers")
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "precious"), []byte("x"), 0o600)
	dir, _ := PrepareSocketDir(state, "moby", "c1")
	os.WriteFile(filepath.Join(dir, vocab.SocketName), nil, 0o600)
	if err := RemoveSocketDir(state, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("not removed: %v", err)
	}
	if err := RemoveSocketDir(state, dir); err != nil {
		t.Fatalf("already gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "moby")); err != nil {
		t.Errorf("the namespace's directory went too: %v", err)
	}
	os.Symlink(outside, filepath.Join(state, "moby", "link"))
	os.WriteFile(filepath.Join(state, "moby", "file"), nil, 0o600)
	nons, _ := PrepareSocketDir(state, "", "c2")
	for _, bad := range []string{outside, filepath.Join(state, "moby", "link"), filepath.Join(state, "moby", "file"), state,
		filepath.Join(state, "moby"), filepath.Join(state, "c1"), filepath.Join(state, "-x", "c1"), filepath.Join(state, "moby", "c1", "..", "..", "x"),
		filepath.Join(state, "moby", "c1", "deeper")} {
		if err := RemoveSocketDir(state, bad); !errors.Is(err, api.ErrPermissionDenied) {
			t.Errorf("RemoveSocketDir(%s) = %v", bad, err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "precious")); err != nil {
		t.Fatalf("removed outside the state directory: %v", err)
	}
	if err := RemoveSocketDir(state, nons); err != nil {
		t.Fatalf("a container's directory without a namespace: %v", err)
	}
}

// A namespace directory that is a symlink out of the state directory is
// not followed: the container's directory below it is not removed.
func TestRemoveSocketDirSymlinkedNamespace(t *testing.T) {
	state := filepath.Join(t.TempDir(), "containers")
	victim := t.TempDir()
	if err := os.MkdirAll(filepath.Join(victim, "c1"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(victim, "c1", "precious"), []byte("x"), 0o600)
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(state, "moby")); err != nil {
		t.Fatal(err)
	}
	err := RemoveSocketDir(state, filepath.Join(state, "moby", "c1"))
	if !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("RemoveSocketDir through a symlinked namespace = %v; want permission denied", err)
	}
	if _, err := os.Stat(filepath.Join(victim, "c1", "precious")); err != nil {
		t.Fatalf("removed through a symlinked namespace: %v", err)
	}
	if _, err := PrepareSocketDir(state, "moby", "c1"); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("PrepareSocketDir through a symlinked namespace = %v; want permission denied", err)
	}
}

func TestHookSpec(t *testing.T) {
	h := HookConfig{Stage: StagePoststop, Socket: "/s", SocketDir: "/st/_/c", StateDir: "/st"}.Spec("/usr/bin/vgpu-hook")
	if h.Path != "/usr/bin/vgpu-hook" || h.Timeout == nil || *h.Timeout != HookTimeout || !reflect.DeepEqual(h.Env, HookEnv) {
		t.Fatalf("hook %+v", h)
	}
	h.Env[0] = "LD_PRELOAD=/x.so"
	if HookEnv[0] != "PATH=/usr/sbin:/usr/bin:/sbin:/bin" {
		t.Fatal("the hook shares HookEnv")
	}
	if time.Duration(HookTimeout)*time.Second <= HookDeadline {
		t.Fatal("the hook's own deadline is not before runc's timeout")
	}
}
