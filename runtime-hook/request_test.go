package runtimehook

import (
	"errors"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
)

// specWith returns a spec whose process has env and which has annotations
// ann (keys and values alternating).
func specWith(env []string, ann ...string) *specs.Spec {
	s := &specs.Spec{Process: &specs.Process{Args: []string{"sh"}, Env: append([]string{"PATH=/bin"}, env...)}}
	if len(ann) > 0 {
		s.Annotations = map[string]string{}
		for i := 0; i+1 < len(ann); i += 2 {
			s.Annotations[ann[i]] = ann[i+1]
		}
	}
	return s
}

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spec   *specs.Spec
		tenant string
		want   *Request // nil: no request
	}{
		{"nothing", specWith(nil), "", nil},
		{"nothing, other annotations", specWith([]string{"HOME=/root"}, "io.kubernetes.pod.name", "p"), "team-a", nil},
		{"no process", &specs.Spec{}, "", nil},
		{"empty values are absent", specWith([]string{"VGPU_MEMORY=", "VGPU_DEVICES="}, AnnotationCompute, ""), "", nil},
		{"env memory", specWith([]string{"VGPU_MEMORY=2GiB"}), "", &Request{Memory: 2 << 30, Devices: 1}},
		{"env memory Gi", specWith([]string{"VGPU_MEMORY=2Gi"}), "", &Request{Memory: 2 << 30, Devices: 1}},
		{"env memory Mi", specWith([]string{"VGPU_MEMORY=512Mi"}), "", &Request{Memory: 512 << 20, Devices: 1}},
		{"env memory Ki", specWith([]string{"VGPU_MEMORY=4Ki"}), "", &Request{Memory: 4 << 10, Devices: 1}},
		{"env memory G", specWith([]string{"VGPU_MEMORY=3G"}), "", &Request{Memory: 3e9, Devices: 1}},
		{"env memory M", specWith([]string{"VGPU_MEMORY=5M"}), "", &Request{Memory: 5e6, Devices: 1}},
		{"env memory K", specWith([]string{"VGPU_MEMORY=7K"}), "", &Request{Memory: 7e3, Devices: 1}},
		{"env memory bytes", specWith([]string{"VGPU_MEMORY=4096"}), "", &Request{Memory: 4096, Devices: 1}},
		{"env compute only", specWith([]string{"VGPU_COMPUTE=3"}), "", &Request{Compute: 3, Devices: 1}},
		{"env devices only", specWith([]string{"VGPU_DEVICES=2"}), "", &Request{Devices: 2}},
		{"env all", specWith([]string{"VGPU_MEMORY=1Gi", "VGPU_COMPUTE=10", "VGPU_DEVICES=4"}), "team-a",
			&Request{Tenant: "team-a", Memory: 1 << 30, Compute: 10, Devices: 4}},
		{"annotations", specWith(nil, AnnotationMemory, "64Mi", AnnotationCompute, "2", AnnotationDevices, "3"), "",
			&Request{Memory: 64 << 20, Compute: 2, Devices: 3}},
		{"annotations win", specWith([]string{"VGPU_MEMORY=1Gi", "VGPU_COMPUTE=1", "VGPU_DEVICES=1"},
			AnnotationMemory, "2Gi", AnnotationCompute, "5", AnnotationDevices, "2"), "",
			&Request{Memory: 2 << 30, Compute: 5, Devices: 2}},
		{"annotation wins per key", specWith([]string{"VGPU_MEMORY=1Gi", "VGPU_COMPUTE=7"}, AnnotationMemory, "2Gi"), "",
			&Request{Memory: 2 << 30, Compute: 7, Devices: 1}},
		{"empty annotation falls back to env", specWith([]string{"VGPU_MEMORY=1Gi"}, AnnotationMemory, ""), "",
			&Request{Memory: 1 << 30, Devices: 1}},
		{"spaces around a size", specWith(nil, AnnotationMemory, " 2 GiB "), "", &Request{Memory: 2 << 30, Devices: 1}},
		{"same value twice", specWith([]string{"VGPU_MEMORY=1Gi", "VGPU_MEMORY=1Gi"}), "", &Request{Memory: 1 << 30, Devices: 1}},
		{"tenant restated", specWith([]string{"VGPU_TENANT=team-a", "VGPU_MEMORY=1Gi"}, AnnotationTenant, "team-a"), "team-a",
			&Request{Tenant: "team-a", Memory: 1 << 30, Devices: 1}},
		{"empty tenant claim", specWith([]string{"VGPU_TENANT=", "VGPU_DEVICES=1"}, AnnotationTenant, ""), "team-a",
			&Request{Tenant: "team-a", Devices: 1}},
		{"max devices", specWith([]string{"VGPU_DEVICES=4294967295"}), "", &Request{Devices: 1<<32 - 1}},
		// A pod's annotations reach its sandbox too: only its containers ask.
		{"kubernetes sandbox", specWith(nil, AnnotationContainerType, "sandbox", AnnotationMemory, "1Gi", AnnotationTenant, "team-b"), "team-a", nil},
		{"kubernetes container", specWith(nil, AnnotationContainerType, "container", AnnotationMemory, "1Gi"), "team-a",
			&Request{Tenant: "team-a", Memory: 1 << 30, Devices: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.spec, tc.tenant)
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("ParseRequest = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseRequestMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		msg  string // the error starts with it
	}{
		{"bad unit annotation", specWith(nil, AnnotationMemory, "12X"), `annotation vgpu.io/memory="12X": size "12X": `},
		{"bad unit env", specWith([]string{"VGPU_MEMORY=12X"}), `env VGPU_MEMORY="12X": size "12X": `},
		{"negative memory", specWith([]string{"VGPU_MEMORY=-1Gi"}), `env VGPU_MEMORY="-1Gi": size "-1Gi"`},
		{"zero memory", specWith([]string{"VGPU_MEMORY=0"}), `env VGPU_MEMORY="0": want a positive size`},
		{"fraction", specWith(nil, AnnotationMemory, "1.5Gi"), `annotation vgpu.io/memory="1.5Gi": size`},
		{"overflow", specWith(nil, AnnotationMemory, "99999999999Ti"), `annotation vgpu.io/memory="99999999999Ti": size`},
		{"compute word", specWith([]string{"VGPU_COMPUTE=lots"}), `env VGPU_COMPUTE="lots": want a whole number`},
		{"compute zero", specWith(nil, AnnotationCompute, "0"), `annotation vgpu.io/compute="0": want a whole number`},
		{"compute fraction", specWith(nil, AnnotationCompute, "0.5"), `annotation vgpu.io/compute="0.5"`},
		{"devices zero", specWith([]string{"VGPU_DEVICES=0"}), `env VGPU_DEVICES="0": want a whole number from 1`},
		{"devices negative", specWith([]string{"VGPU_DEVICES=-2"}), `env VGPU_DEVICES="-2"`},
		{"devices too many", specWith(nil, AnnotationDevices, "4294967296"), `annotation vgpu.io/devices="4294967296"`},
		{"devices hex", specWith(nil, AnnotationDevices, "0x2"), `annotation vgpu.io/devices="0x2"`},
		{"bad annotation hides good env", specWith([]string{"VGPU_MEMORY=1Gi"}, AnnotationMemory, "lots"), `annotation vgpu.io/memory="lots"`},
		{"conflicting env", specWith([]string{"VGPU_MEMORY=1Gi", "VGPU_MEMORY=8Gi"}), `env VGPU_MEMORY="1Gi": set again to "8Gi"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.spec, "team-a")
			if err == nil {
				t.Fatalf("ParseRequest = %+v, want an error", got)
			}
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Errorf("error %q is not invalid-argument", err)
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Errorf("error %q is not a *RequestError", err)
			}
			if !strings.HasPrefix(err.Error(), tc.msg) {
				t.Errorf("error %q, want it to start with %q", err, tc.msg)
			}
		})
	}
	if _, err := ParseRequest(nil, ""); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("ParseRequest(nil) = %v, want invalid argument", err)
	}
}

func TestParseRequestTenantClaims(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     *specs.Spec
		operator string
		msg      string
	}{
		{"env claims another", specWith([]string{"VGPU_TENANT=team-b", "VGPU_MEMORY=1Gi"}), "team-a",
			`env VGPU_TENANT="team-b": this runtime serves tenant "team-a"`},
		{"annotation claims another", specWith([]string{"VGPU_MEMORY=1Gi"}, AnnotationTenant, "team-b"), "team-a",
			`annotation vgpu.io/tenant="team-b": this runtime serves tenant "team-a"`},
		{"annotation restates, env claims another", specWith([]string{"VGPU_TENANT=root", "VGPU_DEVICES=1"}, AnnotationTenant, "team-a"), "team-a",
			`env VGPU_TENANT="root"`},
		{"second env occurrence claims another", specWith([]string{"VGPU_TENANT=team-a", "VGPU_TENANT=team-b", "VGPU_DEVICES=1"}), "team-a",
			`env VGPU_TENANT="team-b"`},
		{"claim without a request", specWith([]string{"VGPU_TENANT=team-b"}), "team-a", `env VGPU_TENANT="team-b"`},
		{"claim where the operator set none", specWith([]string{"VGPU_TENANT=team-b", "VGPU_MEMORY=1Gi"}), "",
			`env VGPU_TENANT="team-b": a container may not choose its tenant`},
		{"annotation claim where the operator set none", specWith(nil, AnnotationTenant, "x", AnnotationMemory, "1Gi"), "",
			`annotation vgpu.io/tenant="x": a container may not choose its tenant`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.spec, tc.operator)
			if err == nil {
				t.Fatalf("ParseRequest = %+v, want a refusal", got)
			}
			if !errors.Is(err, api.ErrPermissionDenied) {
				t.Errorf("error %q is not permission-denied", err)
			}
			if !strings.HasPrefix(err.Error(), tc.msg) {
				t.Errorf("error %q, want it to start with %q", err, tc.msg)
			}
		})
	}
}
