package runtimehook

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
)

func TestSmiMount(t *testing.T) {
	s := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/usr/local/bin//vgpu-smi", Type: "bind", Source: "/image/fake-smi"}, // the image's own: replaced
	}}
	m := SmiMount{Source: "/usr/local/bin/vgpu-smi"}
	if err := m.Modify(s); err != nil {
		t.Fatal(err)
	}
	want := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: ContainerSmi, Type: "bind", Source: "/usr/local/bin/vgpu-smi", Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
	if !reflect.DeepEqual(s.Mounts, want) {
		t.Fatalf("mounts %+v, want %+v", s.Mounts, want)
	}
	checkIdempotent(t, m, s)
	for _, bad := range []string{"", "vgpu-smi", "/usr/../bin/vgpu-smi"} {
		if err := (SmiMount{Source: bad}).Modify(&specs.Spec{}); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "vgpu-smi mount") {
			t.Errorf("source %q: err = %v", bad, err)
		}
	}
}

// A container that asks for a vGPU gets vgpu-smi where the runtime has
// one, and no mount where it has none.
func TestAttachMountsSmi(t *testing.T) {
	a := Attach{Request: &Request{Tenant: "t", Memory: 1 << 20, Devices: 1}, ID: "c1", Namespace: "moby",
		Socket: "/run/vgpu/mediator.sock", Hook: "/usr/local/bin/vgpu-hook", StateDir: "/run/vgpu/containers"}
	smiMounts := func(a Attach) []specs.Mount {
		s := &specs.Spec{Process: &specs.Process{}}
		if err := a.Modifiers().Modify(s); err != nil {
			t.Fatal(err)
		}
		var out []specs.Mount
		for _, m := range s.Mounts {
			if m.Destination == ContainerSmi {
				out = append(out, m)
			}
		}
		return out
	}
	if ms := smiMounts(a); len(ms) != 0 {
		t.Fatalf("no vgpu-smi given, mounts %+v", ms)
	}
	a.Smi = "/opt/vgpu/vgpu-smi"
	if ms := smiMounts(a); len(ms) != 1 || ms[0].Source != "/opt/vgpu/vgpu-smi" {
		t.Fatalf("mounts %+v, want one of /opt/vgpu/vgpu-smi", ms)
	}
}

func TestSmiSetting(t *testing.T) {
	dir := t.TempDir()
	self := writeExe(t, filepath.Join(dir, "bin", "vgpu-runtime"))
	lone := writeExe(t, filepath.Join(dir, "alone", "vgpu-runtime"))
	smi := writeExe(t, filepath.Join(dir, "bin", "vgpu-smi"))
	other := writeExe(t, filepath.Join(dir, "opt", "vgpu-smi"))
	plain := filepath.Join(dir, "opt", "not-exe")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, flag, self, want string
		err                    error
	}{
		{"beside the wrapper", "", self, smi, nil},
		{"none beside it: no mount", "", lone, "", nil},
		{"wrapper unknown", "", "", "", nil},
		{"given", other + "/", self, other, nil},
		{"relative", "opt/vgpu-smi", self, "", api.ErrInvalidArgument},
		{"missing", filepath.Join(dir, "nope"), self, "", api.ErrUnavailable},
		{"not executable", plain, self, "", api.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := &Invocation{Smi: tc.flag}
			err := inv.smiSetting(tc.self)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("smiSetting = %v, want %v", err, tc.err)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "vgpu-smi") && !strings.Contains(err.Error(), tc.flag) {
					t.Fatalf("error %v names neither the flag nor the path", err)
				}
				return
			}
			if inv.Smi != tc.want {
				t.Fatalf("Smi = %q, want %q", inv.Smi, tc.want)
			}
		})
	}
}
