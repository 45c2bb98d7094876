// Package version names the build of a vgpu binary, for its --version.
package version

import (
	"fmt"
	"runtime/debug"

	"github.com/vgpu/vgpu/api"
)

// String is what prog prints for --version: the module version it was built
// from ("devel" for a build in a work tree) and the protocol it speaks,
// which is what decides whether two vgpu binaries can talk. It avoids the
// word "version": dockerd parses its default runtime's --version output by
// that word, and vgpu-runtime prints this line before runc's.
func String(prog string) string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return fmt.Sprintf("%s %s (protocol %d)", prog, v, api.Version)
}
