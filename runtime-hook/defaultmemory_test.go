package runtimehook

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/isolation"
)

// admitter is a mediator that admits through isolation's admission, as
// the real one does.
type admitter struct{ adm *isolation.Admission }

func (a admitter) Register(r api.Register) (*api.RegisterReply, error) {
	g, _, err := a.adm.Admit(isolation.Request{Namespace: r.Namespace, Container: r.Container, Tenant: r.Tenant,
		Memory: r.Memory, Compute: r.Compute, Devices: r.Devices})
	if err != nil {
		return nil, err
	}
	return &api.RegisterReply{Tenant: g.Tenant, Memory: g.Memory, Socket: filepath.Join(r.SocketDir, vocab.SocketName)}, nil
}
func (admitter) Release(string, string) error { return nil }
func (admitter) Close() error                 { return nil }

// TestDefaultMemory follows a container under tenant team-a's runtime from
// its spec to its admission: one that asks for a vGPU without saying how
// much memory (VGPU_DEVICES only) reserves the tenant's default_memory;
// one that asks for nothing is not attached at all, and reserves nothing,
// as docs/quota.md says.
func TestDefaultMemory(t *testing.T) {
	cfg, err := isolation.Parse("q.toml", []byte("[tenants.team-a]\nmemory = \"4GiB\"\ndefault_memory = \"512MiB\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	adm := isolation.NewAdmission(cfg)

	req, err := ParseRequest(&specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin"}}}, "team-a")
	if err != nil || req != nil {
		t.Fatalf("a container that asks for nothing: request %+v, %v; want none (not attached)", req, err)
	}

	spec := &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin", EnvDevices + "=1"}}, Root: &specs.Root{Path: "rootfs"}}
	req, err = ParseRequest(spec, "team-a")
	if err != nil || req == nil || req.Memory != 0 {
		t.Fatalf("a container that asks for a device only: request %+v, %v; want one for no memory", req, err)
	}
	b, _ := rootBundle(t, "rootfs")
	state := filepath.Join(t.TempDir(), "containers")
	dir, err := PrepareSocketDir(state, "moby", "abc")
	if err != nil {
		t.Fatal(err)
	}
	a := Attach{Request: req, ID: "abc", Namespace: "moby", Socket: "/run/vgpu/mediator.sock", Hook: "/usr/bin/vgpu-hook", StateDir: state}
	if err := a.Modifiers().Modify(spec); err != nil {
		t.Fatal(err)
	}
	if spec.Hooks == nil || len(spec.Hooks.CreateRuntime) != 1 {
		t.Fatalf("hooks %+v: want one createRuntime hook", spec.Hooks)
	}
	hc, err := ParseHookArgs(spec.Hooks.CreateRuntime[0].Args)
	if err != nil {
		t.Fatal(err)
	}
	if hc.Memory != 0 || hc.SocketDir != dir {
		t.Fatalf("hook config %+v: want memory 0 in %s", hc, dir)
	}
	var log bytes.Buffer
	st := &specs.State{ID: "abc", Pid: 4242, Bundle: b, Status: specs.StateCreating}
	dial := func(string) (Mediator, error) { return admitter{adm}, nil }
	if err := RunHook(context.Background(), hc, st, dial, &log); err != nil {
		t.Fatalf("RunHook: %v", err)
	}
	ts := adm.Tenants()
	if len(ts) != 1 || ts[0].Name != "team-a" || ts[0].Reserved != 512<<20 || ts[0].Containers != 1 {
		t.Fatalf("tenants after the container started: %+v; want team-a's default_memory, 512 MiB, reserved by one container", ts)
	}
	if !bytes.Contains(log.Bytes(), []byte("512.0 MiB")) {
		t.Errorf("the hook's log %q does not say what was reserved", log.String())
	}
}
