package runtimehook

import (
	"fmt"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// A container finds the mediator at vocab.InContainerSocket: its own
// socket directory (on the host, SocketDir), mounted read-only at
// vocab.InContainerSocketDir, holds the socket the mediator made for it.

// SocketMountOptions are the options of the socket directory's bind mount.
var SocketMountOptions = []string{"rbind", "ro", "nosuid", "nodev", "noexec"}

// Modifier is one edit of a container's spec. Each does one thing, checks
// its preconditions and is idempotent, so a chain applied twice gives the
// same spec as applied once.
type Modifier interface {
	Modify(*specs.Spec) error
}

// ModifierFunc adapts a function to Modifier.
type ModifierFunc func(*specs.Spec) error

// Modify calls f.
func (f ModifierFunc) Modify(s *specs.Spec) error { return f(s) }

// Chain applies its modifiers in order and stops at the first error. The
// spec may then be half edited: callers discard it.
type Chain []Modifier

// Modify applies every modifier of c to s.
func (c Chain) Modify(s *specs.Spec) error {
	if s == nil {
		return fmt.Errorf("modify: no spec: %w", api.ErrInvalidArgument)
	}
	for _, m := range c {
		if err := m.Modify(s); err != nil {
			return err
		}
	}
	return nil
}

// SocketMount bind-mounts the host directory Source read-only at
// vocab.InContainerSocketDir. Mounts the spec already has there or below are
// dropped: that path belongs to the mediator, and a later mount could hide
// the real socket. The mount goes last, so none of the others covers it.
type SocketMount struct{ Source string }

// Modify adds the mount.
func (m SocketMount) Modify(s *specs.Spec) error {
	if !path.IsAbs(m.Source) || path.Clean(m.Source) != m.Source {
		return fmt.Errorf("socket mount: source %q is not a clean absolute path: %w", m.Source, api.ErrInvalidArgument)
	}
	s.Mounts = slices.DeleteFunc(s.Mounts, func(mt specs.Mount) bool {
		return within(path.Clean("/"+mt.Destination), vocab.InContainerSocketDir)
	})
	s.Mounts = append(s.Mounts, specs.Mount{
		Destination: vocab.InContainerSocketDir,
		Type:        "bind",
		Source:      m.Source,
		Options:     slices.Clone(SocketMountOptions),
	})
	return nil
}

// within reports whether the clean absolute path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// SetEnv sets variables ("KEY=value") in the container's environment. Every
// earlier setting of those keys, the image's included, is removed, so the
// value set here is the only one.
type SetEnv []string

// Modify sets the variables.
func (e SetEnv) Modify(s *specs.Spec) error {
	if s.Process == nil {
		return fmt.Errorf("set environment: the spec has no process: %w", api.ErrInvalidArgument)
	}
	keys := map[string]bool{}
	for _, kv := range e {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("set environment: %q is not KEY=value: %w", kv, api.ErrInvalidArgument)
		}
		keys[k] = true
	}
	s.Process.Env = slices.DeleteFunc(s.Process.Env, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return keys[k]
	})
	s.Process.Env = append(s.Process.Env, e...)
	return nil
}

// HookStage is an OCI hook point that vgpu-hook serves.
type HookStage string

// Stages.
const (
	StageCreateRuntime HookStage = "createRuntime" // register with the mediator
	StagePoststop      HookStage = "poststop"      // release
)

// AddHook installs Hook at Stage. A hook of the same path already at that
// stage (an earlier edit of this bundle) is replaced; others are kept.
type AddHook struct {
	Stage HookStage
	Hook  specs.Hook
}

// Modify adds the hook.
func (a AddHook) Modify(s *specs.Spec) error {
	if !path.IsAbs(a.Hook.Path) {
		return fmt.Errorf("%s hook: path %q is not absolute: %w", a.Stage, a.Hook.Path, api.ErrInvalidArgument)
	}
	if s.Hooks == nil {
		s.Hooks = &specs.Hooks{}
	}
	var list *[]specs.Hook
	switch a.Stage {
	case StageCreateRuntime:
		list = &s.Hooks.CreateRuntime
	case StagePoststop:
		list = &s.Hooks.Poststop
	default:
		return fmt.Errorf("hook stage %q: want %s or %s: %w", a.Stage, StageCreateRuntime, StagePoststop, api.ErrInvalidArgument)
	}
	*list = slices.DeleteFunc(*list, func(h specs.Hook) bool { return h.Path == a.Hook.Path })
	h := a.Hook
	h.Args = slices.Clone(h.Args)
	h.Env = slices.Clone(h.Env)
	if h.Timeout != nil {
		t := *h.Timeout
		h.Timeout = &t
	}
	*list = append(*list, h)
	return nil
}

// Attach is where a container with a request is attached to the mediator.
type Attach struct {
	Request   *Request
	ID        string // container id
	Namespace string // containerd namespace
	Socket    string // the mediator's operator socket, on the host
	Hook      string // absolute path of vgpu-hook, on the host
	StateDir  string // host directory that holds the containers' socket directories
	Smi       string // vgpu-smi on the host, mounted at ContainerSmi; "": none
}

// SocketDir is the container's socket directory on the host:
// StateDir/Namespace/ID.
func (a Attach) SocketDir() string { return SocketDir(a.StateDir, a.Namespace, a.ID) }

// Modifiers returns the chain of edits that attach the container: its
// socket directory mounted, the client's environment, the hooks, and
// vgpu-smi where the runtime has it.
func (a Attach) Modifiers() Chain {
	reg := HookConfig{
		Stage:     StageCreateRuntime,
		Socket:    a.Socket,
		Namespace: a.Namespace,
		Tenant:    a.Request.Tenant,
		Memory:    a.Request.Memory,
		Compute:   a.Request.Compute,
		Devices:   a.Request.Devices,
		SocketDir: a.SocketDir(),
		StateDir:  a.StateDir,
	}
	rel := HookConfig{
		Stage:     StagePoststop,
		Socket:    a.Socket,
		Namespace: a.Namespace,
		SocketDir: a.SocketDir(),
		StateDir:  a.StateDir,
	}
	chain := Chain{
		SocketMount{Source: a.SocketDir()},
		SetEnv{
			EnvSocket + "=" + vocab.InContainerSocket,
			fmt.Sprintf("%s=%d", EnvDevices, a.Request.Devices),
		},
		AddHook{Stage: StageCreateRuntime, Hook: reg.Spec(a.Hook)},
		AddHook{Stage: StagePoststop, Hook: rel.Spec(a.Hook)},
	}
	if a.Smi != "" {
		chain = append(chain, SmiMount{Source: a.Smi})
	}
	return chain
}
