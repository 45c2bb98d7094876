package runtimehook

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// FuzzParseRequest feeds arbitrary values to every request key, through
// annotations or the environment. ParseRequest never panics; it fails with
// a typed error that names the key and quotes the value, or returns a
// request that agrees with the values it was given.
func FuzzParseRequest(f *testing.F) {
	f.Add("2GiB", "10", "1", "", "team-a", false)
	f.Add("12X", "", "", "", "", true)
	f.Add("", "0", "", "", "", false)
	f.Add("", "", "-1", "team-b", "team-a", true)
	f.Add("18446744073709551615", "4294967296", "99999999999", "", "", false)
	f.Add("1.5Gi", " 3 ", "0x10", "team-a", "team-a", true)
	f.Add("1Gi\x00", "\n", "1=2", "\xff", "", false)
	f.Fuzz(func(t *testing.T, memory, compute, devices, claim, operator string, annotate bool) {
		spec := &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin"}}}
		set := func(ann, env, v string) {
			if annotate {
				if spec.Annotations == nil {
					spec.Annotations = map[string]string{}
				}
				spec.Annotations[ann] = v
			} else {
				spec.Process.Env = append(spec.Process.Env, env+"="+v)
			}
		}
		set(AnnotationMemory, EnvMemory, memory)
		set(AnnotationCompute, EnvCompute, compute)
		set(AnnotationDevices, EnvDevices, devices)
		set(AnnotationTenant, EnvTenant, claim)

		req, err := ParseRequest(spec, operator)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %q is not a *RequestError", err)
			}
			if !errors.Is(err, api.ErrInvalidArgument) && !errors.Is(err, api.ErrPermissionDenied) {
				t.Fatalf("error %q is neither invalid-argument nor permission-denied", err)
			}
			if !strings.Contains(err.Error(), re.Key+"="+strconv.Quote(re.Value)) {
				t.Fatalf("error %q does not name %s=%q", err, re.Key, re.Value)
			}
			return
		}
		if claim != "" && claim != operator {
			t.Fatalf("claim %q accepted for operator tenant %q", claim, operator)
		}
		if req == nil {
			if memory != "" || compute != "" || devices != "" {
				t.Fatalf("values (%q, %q, %q) gave no request", memory, compute, devices)
			}
			return
		}
		if req.Tenant != operator {
			t.Fatalf("tenant %q, want the operator's %q", req.Tenant, operator)
		}
		if req.Devices == 0 {
			t.Fatalf("request %+v has no devices", req)
		}
		if memory != "" {
			n, err := api.ParseSize(memory)
			if err != nil || n != req.Memory || n == 0 {
				t.Fatalf("memory %q gave %d; ParseSize says %d, %v", memory, req.Memory, n, err)
			}
		} else if req.Memory != 0 {
			t.Fatalf("no memory asked, got %d", req.Memory)
		}
		if compute != "" {
			if n, err := strconv.ParseUint(strings.TrimSpace(compute), 10, 32); err != nil || uint32(n) != req.Compute {
				t.Fatalf("compute %q gave %d", compute, req.Compute)
			}
		}
	})
}

// FuzzReadState feeds arbitrary bytes to ReadState as runc's state on the
// hook's stdin: the hook hands the id to path joins and the pid to
// /proc lookups, so what it accepts must be a valid id and a pid in range,
// and everything it refuses must be invalid-argument (the hook's exit code
// and message depend on that).
func FuzzReadState(f *testing.F) {
	f.Add([]byte(`{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":4242,"bundle":"/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc","annotations":{"io.kubernetes.cri.container-type":"container"}}`))
	f.Add([]byte(`{"ociVersion":"1.2.0","id":"web.1_x-2","status":"stopped","bundle":"/b"}`))
	f.Add([]byte(`{"id":"a","pid":0}`))
	f.Add([]byte(`{"id":"../etc","pid":1}`))
	f.Add([]byte(`{"id":"a","pid":4294967296}`))
	f.Add([]byte(`{"id":"a","pid":-1,"id":"b"}`))
	f.Add([]byte(`{"id":"a\u0000b","pid":1e3}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ReadState(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("ReadState(%q): error %q is not invalid-argument", data, err)
			}
			if st != nil {
				t.Fatalf("ReadState(%q) = %+v beside error %v", data, st, err)
			}
			return
		}
		if len(data) > maxStateJSON {
			t.Fatalf("ReadState accepted %d bytes, more than %d", len(data), maxStateJSON)
		}
		if _, err := vocab.ParseContainerID(st.ID); err != nil {
			t.Fatalf("ReadState(%q) accepted id %q: %v", data, st.ID, err)
		}
		if st.Pid < 0 || st.Pid > 1<<32-1 {
			t.Fatalf("ReadState(%q) accepted pid %d", data, st.Pid)
		}
	})
}
