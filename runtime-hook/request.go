package runtimehook

import (
	"fmt"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
)

// Annotations a container (a Kubernetes pod, `nerdctl run --annotation`)
// sets to ask for a vGPU. They win over the environment.
const (
	AnnotationMemory  = "vgpu.io/memory"  // bytes, with an optional unit: 2GiB, 512Mi, 4G
	AnnotationCompute = "vgpu.io/compute" // fair-share weight, a positive whole number
	AnnotationDevices = "vgpu.io/devices" // virtual devices, a positive whole number
	AnnotationTenant  = "vgpu.io/tenant"  // a claim; only the operator's tenant is accepted
)

// The annotation by which containerd's CRI tells a pod's sandbox (its pause
// container) from the pod's containers. The runtime's pod_annotations copies
// the pod's vgpu.io/* annotations into both; only the containers ask.
const (
	AnnotationContainerType = "io.kubernetes.cri.container-type"
	ContainerTypeSandbox    = "sandbox"
)

// Environment variables of the container's process: the request (as the
// annotations), and what the wrapper sets for the client SDK.
const (
	EnvMemory  = "VGPU_MEMORY"
	EnvCompute = "VGPU_COMPUTE"
	EnvDevices = "VGPU_DEVICES"
	EnvTenant  = "VGPU_TENANT"
	EnvSocket  = "VGPU_SOCKET"
)

// Request is what a container asked for, checked, with the tenant the
// operator gave it.
type Request struct {
	Tenant  string // the operator's tenant; "": the mediator maps the namespace
	Memory  uint64 // bytes; 0: the tenant's default
	Compute uint32 // weight; 0: the tenant's default
	Devices uint32 // virtual devices, at least 1
}

// RequestError is a request key with a value that cannot be honoured. It
// wraps api.ErrInvalidArgument (malformed) or api.ErrPermissionDenied (a
// tenant claim).
type RequestError struct {
	Source string // "annotation" or "env"
	Key    string
	Value  string
	Err    error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("%s %s=%q: %v", e.Source, e.Key, e.Value, e.Err)
}

func (e *RequestError) Unwrap() error { return e.Err }

// requestKey pairs an annotation with the environment variable it overrides.
type requestKey struct{ annotation, env string }

var (
	keyMemory  = requestKey{AnnotationMemory, EnvMemory}
	keyCompute = requestKey{AnnotationCompute, EnvCompute}
	keyDevices = requestKey{AnnotationDevices, EnvDevices}
)

// setting is one value found in the spec, with where it came from.
type setting struct{ source, key, value string }

func (s setting) fail(err error) error {
	return &RequestError{Source: s.source, Key: s.key, Value: s.value, Err: err}
}

// envValues returns every value spec's process environment gives key, in order.
func envValues(spec *specs.Spec, key string) []string {
	if spec.Process == nil {
		return nil
	}
	var vs []string
	for _, kv := range spec.Process.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			vs = append(vs, v)
		}
	}
	return vs
}

// lookup finds k's value: the annotation if set, else the environment. An
// empty value counts as absent. An environment that sets the key twice to
// different values is refused: the runtime and the program could read
// different ones.
func lookup(spec *specs.Spec, k requestKey) (setting, bool, error) {
	if v := spec.Annotations[k.annotation]; v != "" {
		return setting{"annotation", k.annotation, v}, true, nil
	}
	var found setting
	ok := false
	for _, v := range envValues(spec, k.env) {
		if v == "" {
			continue
		}
		if ok && v != found.value {
			return found, false, found.fail(fmt.Errorf("set again to %q: %w", v, api.ErrInvalidArgument))
		}
		found, ok = setting{"env", k.env, v}, true
	}
	return found, ok, nil
}

// ParseRequest reads a container's vGPU request from its spec. It returns
// nil, nil when the container asks for nothing, and for a Kubernetes pod's
// sandbox, which carries the pod's annotations but runs no program of the
// pod: attaching it would charge the tenant a second time. (A container
// that calls itself a sandbox only opts out.) operatorTenant is the
// tenant the operator gave this runtime ("" for none); a container that
// names another tenant, by VGPU_TENANT or vgpu.io/tenant, is refused with
// ErrPermissionDenied, whether or not it asks for a vGPU. Malformed values
// are refused with ErrInvalidArgument, naming the key and the value.
func ParseRequest(spec *specs.Spec, operatorTenant string) (*Request, error) {
	if spec == nil {
		return nil, fmt.Errorf("no spec: %w", api.ErrInvalidArgument)
	}
	if spec.Annotations[AnnotationContainerType] == ContainerTypeSandbox {
		return nil, nil
	}
	if err := checkTenantClaims(spec, operatorTenant); err != nil {
		return nil, err
	}
	req := &Request{Tenant: operatorTenant, Devices: 1}
	asked := false

	s, ok, err := lookup(spec, keyMemory)
	if err != nil {
		return nil, err
	}
	if ok {
		asked = true
		n, err := api.ParseSize(s.value)
		if err != nil {
			return nil, s.fail(err)
		}
		if n == 0 {
			return nil, s.fail(fmt.Errorf("want a positive size: %w", api.ErrInvalidArgument))
		}
		req.Memory = n
	}

	for _, f := range []struct {
		k    requestKey
		into *uint32
	}{{keyCompute, &req.Compute}, {keyDevices, &req.Devices}} {
		s, ok, err := lookup(spec, f.k)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		asked = true
		n, err := strconv.ParseUint(strings.TrimSpace(s.value), 10, 32)
		if err != nil || n == 0 {
			return nil, s.fail(fmt.Errorf("want a whole number from 1 to %d: %w", uint32(1<<32-1), api.ErrInvalidArgument))
		}
		*f.into = uint32(n)
	}
	if !asked {
		return nil, nil
	}
	return req, nil
}

// checkTenantClaims refuses a container that names a tenant other than the
// operator's. Every occurrence counts; empty ones claim nothing.
func checkTenantClaims(spec *specs.Spec, operatorTenant string) error {
	var claims []setting
	if v := spec.Annotations[AnnotationTenant]; v != "" {
		claims = append(claims, setting{"annotation", AnnotationTenant, v})
	}
	for _, v := range envValues(spec, EnvTenant) {
		if v != "" {
			claims = append(claims, setting{"env", EnvTenant, v})
		}
	}
	for _, c := range claims {
		switch {
		case c.value == operatorTenant:
		case operatorTenant == "":
			return c.fail(fmt.Errorf("a container may not choose its tenant; the operator decides it "+
				"(the runtime's --vgpu-tenant, or the mediator's mapping of the namespace): %w", api.ErrPermissionDenied))
		default:
			return c.fail(fmt.Errorf("this runtime serves tenant %q; a container may not claim another: %w",
				operatorTenant, api.ErrPermissionDenied))
		}
	}
	return nil
}
