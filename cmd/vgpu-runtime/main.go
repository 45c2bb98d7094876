// Command vgpu-runtime is the runtime-class binary (Docker --runtime,
// containerd's BinaryName, a Kubernetes RuntimeClass handler): an OCI
// runtime that hands every command to the real one (runc) unchanged, and on
// create (and run) first attaches a container that asks for a vGPU to the
// mediator by editing its config.json; it refuses to restore one from a
// checkpoint. Its own flags are --vgpu-tenant, --vgpu-runtime,
// --vgpu-socket, --vgpu-hook, --vgpu-state, --vgpu-config and --vgpu-smi
// (--help). The name it is run as says which runtime it is, through the
// settings file vgpuctl install writes (/etc/vgpu/runtime.toml); a name it
// cannot resolve makes it refuse to create containers. See package runtimehook.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/version"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// help is what a lone --help or -h prints. Anything else, --help among
// other arguments included, is the real runtime's to answer.
var help = `usage: vgpu-runtime [--vgpu-tenant NAME] [--vgpu-runtime PATH] [--vgpu-socket PATH]
                    [--vgpu-hook PATH] [--vgpu-state DIR] [--vgpu-config PATH] [--vgpu-smi PATH]
                    RUNTIME-ARGUMENTS...

An OCI runtime wrapper: it passes every argument but its own --vgpu-* flags
to the real runtime (runc) unchanged, and on create and run first attaches a
container that asks for a vGPU (VGPU_* in its environment) to the mediator by
editing its config.json. Docker, containerd and Kubernetes use it as a
runtime class (vgpuctl install docker|containerd).

flags (anywhere among the runtime's arguments, "--vgpu-x V" or "--vgpu-x=V"):
  --vgpu-tenant NAME    the tenant its containers run as; run as vgpu-runtime-NAME
                        (a symlink) it is NAME without this flag
  --vgpu-config PATH    the runtime settings file (default $` + runtimehook.SettingsFileEnv + `,
                        else ` + runtimehook.DefaultSettingsFile + `), written by vgpuctl install:
                        by the name this binary is run as (argv[0]), its tenant,
                        socket and state directory; flags win over it
  --vgpu-runtime PATH   the real runtime, a path or a name in $PATH (default:
                        the first of ` + strings.Join(runtimehook.DefaultRuntimes, ", ") + `)
  --vgpu-socket PATH    the mediator's operator socket (default ` + runtimehook.DefaultOperatorSocket + `)
  --vgpu-hook PATH      vgpu-hook, put in the spec of each container it attaches
                        (default: beside this binary)
  --vgpu-smi PATH       vgpu-smi, mounted read-only at ` + runtimehook.ContainerSmi + ` in each
                        container it attaches (default: beside this binary, if there)
  --vgpu-state DIR      where containers' socket directories are made
                        (default ` + runtimehook.DefaultStateDir + `)
  --version             this wrapper's version, then the real runtime's

Run under a name that is neither a runtime of the settings file, nor
vgpu-runtime, nor vgpu-runtime-TENANT, it refuses to create containers
(a wrapper script must keep argv[0]: exec -a NAME).

The real runtime's own help: RUNTIME --help.
`

func main() {
	inv, err := runtimehook.ParseArgs(os.Args[1:])
	if err != nil {
		fail(inv, err)
	}
	// Only a runtime argument list of exactly --help, -h or --version is
	// the wrapper's: containerd and Docker never send those alongside a
	// command, so nothing they pass through is changed.
	switch {
	case slices.Equal(inv.Args, []string{"--help"}), slices.Equal(inv.Args, []string{"-h"}):
		fmt.Print(help)
		return
	case slices.Equal(inv.Args, []string{"--version"}):
		// The real runtime's version follows, from the exec below: dockerd
		// reads its default runtime's --version output for docker info,
		// and finds runc's lines after this one.
		fmt.Println(version.String("vgpu-runtime"))
	}
	self, err := os.Executable()
	if err != nil {
		self = ""
	}
	// A name that resolves to no runtime stops only what makes a
	// container: the containers that exist must still be stopped and
	// deleted, and those commands need no tenant.
	if err := inv.Resolve(os.Args[0], os.Getenv); err != nil && inv.FromBundle() {
		fail(inv, err)
	}
	if err := inv.Settings(self); err != nil {
		fail(inv, err)
	}
	attached := false
	if inv.FromBundle() {
		if attached, err = runtimehook.EditBundle(inv); err != nil {
			fail(inv, err)
		}
	}
	argv := append([]string{inv.Runtime}, inv.Args...)
	if attached && inv.Command == "create" {
		// The hook registers the container inside runc: staying runc's
		// parent lets a refusal's reason be the error the caller shows.
		os.Exit(inv.RunCreate(argv))
	}
	err = syscall.Exec(inv.Runtime, argv, os.Environ())
	fail(inv, fmt.Errorf("exec %s: %v: %w", inv.Runtime, err, api.ErrUnavailable))
}

func fail(inv *runtimehook.Invocation, err error) {
	inv.ReportError(os.Stderr, err)
	os.Exit(1)
}
