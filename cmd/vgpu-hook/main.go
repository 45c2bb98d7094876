// Command vgpu-hook is the OCI hook vgpu-runtime installs in the spec of a
// container that asks for a vGPU: at createRuntime it registers the
// container with the mediator (a refused admission fails the hook, so the
// container does not start, and the mediator's reason is printed), at
// poststop it releases it. It reads the container's state from stdin.
//
// It runs as root facing a hostile container, so it must be built static
// (CGO_ENABLED=0 go build ./cmd/vgpu-hook): no dynamic loader, nothing an
// LD_PRELOAD could inject. It clears its environment before doing anything,
// never runs a program, and gives up after runtimehook.HookDeadline.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/version"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

func main() {
	os.Clearenv() // the spec sets a fixed one; trust none the less
	_ = os.Chdir("/")
	os.Exit(run(os.Args, os.Stdin, os.Stderr))
}

// dial connects to the mediator, whose answers need not be awaited beyond
// the hook's own deadline. RunHook gives up at that deadline and says on
// what; the connection's timeout, a little later, only backs it up, so
// that the two never race to report one stall.
func dial(socket string) (runtimehook.Mediator, error) {
	o, err := client.DialOperatorTimeout(socket, runtimehook.HookDeadline+250*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return o, nil
}

const help = `usage: vgpu-hook createRuntime --socket PATH --socket-dir DIR --state-dir DIR
                 [--namespace NS] [--tenant NAME] [--memory BYTES] [--compute WEIGHT] [--devices N]
       vgpu-hook poststop --socket PATH --socket-dir DIR --state-dir DIR [--namespace NS]

The OCI hook vgpu-runtime puts in the spec of a container that asks for a
vGPU; it is not run by hand. It reads the container's state from stdin. At
createRuntime it registers the container with the mediator at --socket
(operator socket), which mounts the tenant socket into --socket-dir (a
directory of --state-dir); a refused admission fails it, so the container
does not start. At poststop it releases the container.
`

// run is the hook: it returns the exit status.
func run(argv []string, stdin io.Reader, stderr io.Writer) int {
	// A lone --help or --version is an operator's; a runtime always names
	// a stage first.
	if len(argv) == 2 {
		switch argv[1] {
		case "--help", "-h":
			fmt.Print(help)
			return 0
		case "--version":
			fmt.Println(version.String("vgpu-hook"))
			return 0
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtimehook.HookDeadline)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		cfg, err := runtimehook.ParseHookArgs(argv)
		if err != nil {
			done <- err
			return
		}
		st, err := runtimehook.ReadState(stdin)
		if err != nil {
			done <- err
			return
		}
		done <- runtimehook.RunHook(ctx, cfg, st, dial, stderr)
	}()
	// RunHook gives up at the deadline by itself and says on what; this is
	// the backstop for anything that would not (reading stdin, say).
	backstop := time.NewTimer(runtimehook.HookDeadline + 500*time.Millisecond)
	defer backstop.Stop()
	var err error
	select {
	case err = <-done:
	case <-backstop.C:
		err = fmt.Errorf("did not finish in time (%v): %w", runtimehook.HookDeadline, context.DeadlineExceeded)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vgpu-hook: %v\n", err)
		return 1
	}
	return 0
}
