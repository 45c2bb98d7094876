package runtimehook

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
)

func intp(v int) *int { return &v }

// clone deep-copies a spec through JSON.
func clone(t *testing.T, s *specs.Spec) *specs.Spec {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var c specs.Spec
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// checkIdempotent applies m to a copy of after and wants after unchanged.
func checkIdempotent(t *testing.T, m Modifier, after *specs.Spec) {
	t.Helper()
	again := clone(t, after)
	if err := m.Modify(again); err != nil {
		t.Fatalf("second Modify: %v", err)
	}
	if !reflect.DeepEqual(clone(t, again), clone(t, after)) {
		t.Errorf("not idempotent:\nonce:  %+v\ntwice: %+v", after, again)
	}
}

func socketMount(src string) specs.Mount {
	return specs.Mount{Destination: "/run/vgpu", Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
}

func TestSocketMount(t *testing.T) {
	proc := specs.Mount{Destination: "/proc", Type: "proc", Source: "proc"}
	run := specs.Mount{Destination: "/run", Type: "tmpfs", Source: "tmpfs"}
	near := specs.Mount{Destination: "/run/vgpux", Type: "bind", Source: "/x"}
	for _, tc := range []struct {
		name   string
		mounts []specs.Mount
		want   []specs.Mount
	}{
		{"no mounts", nil, []specs.Mount{socketMount("/s/c1")}},
		{"goes last, after /run", []specs.Mount{proc, run}, []specs.Mount{proc, run, socketMount("/s/c1")}},
		{"keeps neighbours", []specs.Mount{near}, []specs.Mount{near, socketMount("/s/c1")}},
		{"replaces one at /run/vgpu", []specs.Mount{{Destination: "/run/vgpu", Type: "bind", Source: "/evil"}, proc},
			[]specs.Mount{proc, socketMount("/s/c1")}},
		{"drops ones below", []specs.Mount{{Destination: "/run/vgpu/mediator.sock", Type: "bind", Source: "/evil.sock"}},
			[]specs.Mount{socketMount("/s/c1")}},
		{"drops unclean spellings", []specs.Mount{{Destination: "run//vgpu/", Source: "/a"}, {Destination: "/run/x/../vgpu", Source: "/b"}},
			[]specs.Mount{socketMount("/s/c1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Mounts: tc.mounts}
			m := SocketMount{Source: "/s/c1"}
			if err := m.Modify(s); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Mounts, tc.want) {
				t.Fatalf("mounts = %+v\nwant     %+v", s.Mounts, tc.want)
			}
			checkIdempotent(t, m, s)
		})
	}
	for _, src := range []string{"", "relative/dir", "/s/../c1", "/s/c1/"} {
		if err := (SocketMount{Source: src}).Modify(&specs.Spec{}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("source %q: err = %v, want invalid argument", src, err)
		}
	}
}

func TestSocketMountOptionsNotShared(t *testing.T) {
	s := &specs.Spec{}
	if err := (SocketMount{Source: "/s/c"}).Modify(s); err != nil {
		t.Fatal(err)
	}
	s.Mounts[0].Options[0] = "changed"
	if SocketMountOptions[0] != "rbind" {
		t.Fatal("the mount shares its options with SocketMountOptions")
	}
}

func TestSetEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		set  SetEnv
		want []string
	}{
		{"adds", []string{"PATH=/bin"}, SetEnv{"VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=2"},
			[]string{"PATH=/bin", "VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=2"}},
		{"replaces the image's, every occurrence", []string{"VGPU_SOCKET=/tmp/fake.sock", "PATH=/bin", "VGPU_SOCKET=/x", "VGPU_DEVICES=9"},
			SetEnv{"VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=2"},
			[]string{"PATH=/bin", "VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=2"}},
		{"keeps look-alikes", []string{"VGPU_SOCKETS=a", "XVGPU_SOCKET=b", "VGPU_SOCKET"},
			SetEnv{"VGPU_SOCKET=/s"}, []string{"VGPU_SOCKETS=a", "XVGPU_SOCKET=b", "VGPU_SOCKET=/s"}},
		{"empty env", nil, SetEnv{"A="}, []string{"A="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Process: &specs.Process{Env: tc.env}}
			if err := tc.set.Modify(s); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Process.Env, tc.want) {
				t.Fatalf("env = %q, want %q", s.Process.Env, tc.want)
			}
			checkIdempotent(t, tc.set, s)
		})
	}
	if err := (SetEnv{"A=1"}).Modify(&specs.Spec{}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("no process: err = %v", err)
	}
	for _, kv := range []string{"NOEQUALS", "=value"} {
		s := &specs.Spec{Process: &specs.Process{}}
		if err := (SetEnv{kv}).Modify(s); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), kv) {
			t.Errorf("SetEnv{%q}: err = %v", kv, err)
		}
	}
}

func TestAddHook(t *testing.T) {
	ours := specs.Hook{Path: "/usr/bin/vgpu-hook", Args: []string{"vgpu-hook", "createRuntime"}, Env: []string{"PATH=/bin"}, Timeout: intp(10)}
	stale := specs.Hook{Path: "/usr/bin/vgpu-hook", Args: []string{"vgpu-hook", "old"}}
	other := specs.Hook{Path: "/usr/bin/nvidia-ctk", Args: []string{"nvidia-ctk", "hook"}}
	for _, tc := range []struct {
		name  string
		hooks *specs.Hooks
		stage HookStage
		want  *specs.Hooks
	}{
		{"no hooks", nil, StageCreateRuntime, &specs.Hooks{CreateRuntime: []specs.Hook{ours}}},
		{"poststop", nil, StagePoststop, &specs.Hooks{Poststop: []specs.Hook{ours}}},
		{"keeps others", &specs.Hooks{CreateRuntime: []specs.Hook{other}, CreateContainer: []specs.Hook{other}}, StageCreateRuntime,
			&specs.Hooks{CreateRuntime: []specs.Hook{other, ours}, CreateContainer: []specs.Hook{other}}},
		{"replaces its own", &specs.Hooks{CreateRuntime: []specs.Hook{stale, other}}, StageCreateRuntime,
			&specs.Hooks{CreateRuntime: []specs.Hook{other, ours}}},
		{"other stage untouched", &specs.Hooks{Poststop: []specs.Hook{stale}}, StageCreateRuntime,
			&specs.Hooks{CreateRuntime: []specs.Hook{ours}, Poststop: []specs.Hook{stale}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Hooks: tc.hooks}
			m := AddHook{Stage: tc.stage, Hook: ours}
			if err := m.Modify(s); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Hooks, tc.want) {
				t.Fatalf("hooks = %+v\nwant    %+v", s.Hooks, tc.want)
			}
			checkIdempotent(t, m, s)
		})
	}
	t.Run("copies", func(t *testing.T) {
		s := &specs.Spec{}
		m := AddHook{Stage: StagePoststop, Hook: ours}
		if err := m.Modify(s); err != nil {
			t.Fatal(err)
		}
		*s.Hooks.Poststop[0].Timeout = 99
		s.Hooks.Poststop[0].Args[0] = "x"
		s.Hooks.Poststop[0].Env[0] = "x"
		if *ours.Timeout != 10 || ours.Args[0] != "vgpu-hook" || ours.Env[0] != "PATH=/bin" {
			t.Fatal("the spec's hook shares memory with the modifier's")
		}
	})
	for _, bad := range []AddHook{
		{Stage: "prestart", Hook: ours},
		{Stage: StageCreateRuntime, Hook: specs.Hook{Path: "vgpu-hook"}},
		{Stage: StageCreateRuntime, Hook: specs.Hook{}},
	} {
		if err := bad.Modify(&specs.Spec{}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%+v: err = %v, want invalid argument", bad, err)
		}
	}
}

func TestChain(t *testing.T) {
	var order []string
	step := func(name string, err error) Modifier {
		return ModifierFunc(func(*specs.Spec) error {
			order = append(order, name)
			return err
		})
	}
	boom := errors.New("boom")
	if err := (Chain{step("a", nil), step("b", nil), step("c", nil)}).Modify(&specs.Spec{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ""); got != "abc" {
		t.Fatalf("order %q", got)
	}
	order = nil
	if err := (Chain{step("a", nil), step("b", boom), step("c", nil)}).Modify(&specs.Spec{}); err != boom {
		t.Fatalf("err = %v, want boom", err)
	}
	if got := strings.Join(order, ""); got != "ab" {
		t.Fatalf("ran %q after a failure", got)
	}
	if err := (Chain{}).Modify(nil); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("nil spec: %v", err)
	}
}

func TestAttachModifiers(t *testing.T) {
	a := Attach{
		Request:   &Request{Tenant: "team-a", Memory: 2 << 30, Compute: 10, Devices: 2},
		ID:        "c1",
		Namespace: "moby",
		Socket:    "/run/vgpu/mediator.sock",
		Hook:      "/usr/local/bin/vgpu-hook",
		StateDir:  "/run/vgpu/containers",
	}
	s := &specs.Spec{
		Process: &specs.Process{Env: []string{"PATH=/bin", "VGPU_SOCKET=/tmp/mine.sock", "VGPU_MEMORY=2GiB"}},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Hooks:   &specs.Hooks{StartContainer: []specs.Hook{{Path: "/bin/other"}}},
	}
	if err := a.Modifiers().Modify(s); err != nil {
		t.Fatal(err)
	}
	want := &specs.Spec{
		Process: &specs.Process{Env: []string{"PATH=/bin", "VGPU_MEMORY=2GiB", "VGPU_SOCKET=/run/vgpu/mediator.sock", "VGPU_DEVICES=2"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			socketMount("/run/vgpu/containers/moby/c1"),
		},
		Hooks: &specs.Hooks{
			StartContainer: []specs.Hook{{Path: "/bin/other"}},
			CreateRuntime: []specs.Hook{{
				Path: "/usr/local/bin/vgpu-hook",
				Args: []string{"vgpu-hook", "createRuntime", "--socket", "/run/vgpu/mediator.sock",
					"--namespace", "moby", "--tenant", "team-a", "--memory", "2147483648", "--compute", "10", "--devices", "2",
					"--socket-dir", "/run/vgpu/containers/moby/c1", "--state-dir", "/run/vgpu/containers"},
				Env:     []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
				Timeout: intp(10),
			}},
			Poststop: []specs.Hook{{
				Path: "/usr/local/bin/vgpu-hook",
				Args: []string{"vgpu-hook", "poststop", "--socket", "/run/vgpu/mediator.sock", "--namespace", "moby",
					"--socket-dir", "/run/vgpu/containers/moby/c1", "--state-dir", "/run/vgpu/containers"},
				Env:     []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
				Timeout: intp(10),
			}},
		},
	}
	if !reflect.DeepEqual(s, want) {
		g, _ := json.MarshalIndent(s, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("spec:\n%s\nwant:\n%s", g, w)
	}
	checkIdempotent(t, a.Modifiers(), s)
	if err := a.Modifiers().Modify(&specs.Spec{}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("a spec without a process: err = %v", err)
	}
}
