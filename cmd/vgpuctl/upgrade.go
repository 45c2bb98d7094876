package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vgpu/vgpu/internal/upgrade"
)

const upgradeUsage = `usage: vgpuctl upgrade [--binary PATH] [--upgrade-timeout DURATION] [--json]

Live upgrade: the mediator starts the new binary (default: the path of its
own executable, read again from disk, i.e. the new build installed there)
with its own arguments and hands its listening sockets, the host socket and
every container's, to it; the new one restores the containers and sessions
from --state-dir and serves them. The sockets stay bound throughout: tenants
see a pause, and their sessions go on with their device memory. If the new
binary fails before taking over, the mediator serves on as before; if it
fails while restoring, the previous binary is started again in its place.
Either way this exits 1 with the new binary's error. Asked on the mediator's
control socket, --socket with ".upgrade" appended, which only the
mediator's user (and root) may use.
`

func upgradeFlags() (*flag.FlagSet, *upgrade.Request, *bool) {
	fs := flag.NewFlagSet("upgrade", flag.ContinueOnError)
	req := &upgrade.Request{}
	fs.StringVar(&req.Binary, "binary", "", "the new vgpu-mediator (\"\": the running one's executable path, read again)")
	fs.DurationVar(&req.Timeout, "upgrade-timeout", upgrade.DefaultTimeout, "how long the new binary may take to take over, and then to restore")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return fs, req, asJSON
}

func upgradeCmd(socket string, args []string) error {
	fs, req, asJSON := upgradeFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("upgrade: unexpected arguments %q", fs.Args())
	}
	if req.Timeout <= 0 {
		return fmt.Errorf("upgrade: --upgrade-timeout %v: want more than 0", req.Timeout)
	}
	if req.Binary != "" {
		// The mediator runs in its own directory, not this one's.
		abs, err := filepath.Abs(req.Binary)
		if err != nil {
			return fmt.Errorf("upgrade: --binary %q: %w", req.Binary, err)
		}
		req.Binary = abs
	}
	rep, err := upgrade.Ask(socket, *req)
	if *asJSON && rep.OldPid != 0 {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(b))
	}
	if err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	if !*asJSON {
		fmt.Fprintf(os.Stdout, "upgraded: %s serves as pid %d (was pid %d)\n", rep.Binary, rep.NewPid, rep.OldPid)
	}
	return nil
}
