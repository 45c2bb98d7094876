package runtimehook

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
)

// ContainerSmi is where vgpu-smi, the container's view of its own vGPU,
// appears inside a container that asks for a vGPU: on the default $PATH
// of Docker and containerd.
const ContainerSmi = "/usr/local/bin/vgpu-smi"

// SmiName is vgpu-smi's file name, looked for beside the wrapper.
const SmiName = "vgpu-smi"

// SmiMountOptions are the options of vgpu-smi's bind mount: read-only, so
// the container cannot replace the binary for the host or other containers.
var SmiMountOptions = []string{"bind", "ro", "nosuid", "nodev"}

// SmiMount bind-mounts the host file Source read-only at ContainerSmi.
// A mount the spec already has there is replaced.
type SmiMount struct{ Source string }

// Modify adds the mount.
func (m SmiMount) Modify(s *specs.Spec) error {
	if !path.IsAbs(m.Source) || path.Clean(m.Source) != m.Source {
		return fmt.Errorf("vgpu-smi mount: source %q is not a clean absolute path: %w", m.Source, api.ErrInvalidArgument)
	}
	s.Mounts = slices.DeleteFunc(s.Mounts, func(mt specs.Mount) bool {
		return path.Clean("/"+mt.Destination) == ContainerSmi
	})
	s.Mounts = append(s.Mounts, specs.Mount{
		Destination: ContainerSmi,
		Type:        "bind",
		Source:      m.Source,
		Options:     slices.Clone(SmiMountOptions),
	})
	return nil
}

// smiSetting resolves --vgpu-smi: a path given must be an absolute path of
// an executable file; by default vgpu-smi beside the wrapper (self) is used
// if it is there, and none is mounted if not, since the tool is optional.
func (inv *Invocation) smiSetting(self string) error {
	if inv.Smi == "" {
		if self == "" {
			return nil
		}
		if p := filepath.Join(filepath.Dir(self), SmiName); executable(p) == nil {
			inv.Smi = p
		}
		return nil
	}
	if !filepath.IsAbs(inv.Smi) {
		return fmt.Errorf("--vgpu-smi %q: want an absolute path: %w", inv.Smi, api.ErrInvalidArgument)
	}
	inv.Smi = filepath.Clean(inv.Smi)
	if err := executable(inv.Smi); err != nil {
		return fmt.Errorf("--vgpu-smi: %w", err)
	}
	return nil
}

// executable checks that p is an executable regular file.
func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file: %w", p, api.ErrUnavailable)
	}
	return nil
}
