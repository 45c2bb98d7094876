// Command vgpu-runtime is the runtime-class binary (Docker --runtime,
// containerd's BinaryName, a Kubernetes RuntimeClass handler): an OCI
// runtime that hands every command to the real one (runc) unchanged, and on
// create (and run) first attaches a container that asks for a vGPU to the
// mediator by editing its config.json; it refuses to restore one from a
// checkpoint. Its own flags are --vgpu-tenant, --vgpu-runtime,
// --vgpu-socket, --vgpu-hook and --vgpu-state; run as vgpu-runtime-<tenant>
// (a symlink), it serves that tenant, as with --vgpu-tenant. See package
// runtimehook.
package main

import (
	"fmt"
	"os"
	"syscall"

	"github.com/vgpu/vgpu/api"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

func main() {
	inv, err := runtimehook.ParseArgs(os.Args[1:])
	if err != nil {
		fail(inv, err)
	}
	self, err := os.Executable()
	if err != nil {
		self = ""
	}
	if err := inv.TenantFromName(os.Args[0], self); err != nil {
		fail(inv, err)
	}
	if err := inv.Settings(self); err != nil {
		fail(inv, err)
	}
	if inv.FromBundle() {
		if _, err := runtimehook.EditBundle(inv); err != nil {
			fail(inv, err)
		}
	}
	argv := append([]string{inv.Runtime}, inv.Args...)
	err = syscall.Exec(inv.Runtime, argv, os.Environ())
	fail(inv, fmt.Errorf("exec %s: %v: %w", inv.Runtime, err, api.ErrUnavailable))
}

func fail(inv *runtimehook.Invocation, err error) {
	inv.ReportError(os.Stderr, err)
	os.Exit(1)
}
