package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/integration"
)

const installUsage = `usage: vgpuctl install docker|containerd [--config PATH] [--runtime-path PATH] [--tenant NAME]... [--dry-run]

Adds the OCI runtime "vgpu" (and "vgpu-NAME" per --tenant, bound to that
tenant) to Docker's daemon.json or containerd's config.toml, keeping every
other setting. Running it again changes nothing. It prints what to restart.
`

// tenantList is a repeatable --tenant flag.
type tenantList []string

func (l *tenantList) String() string     { return strings.Join(*l, ",") }
func (l *tenantList) Set(s string) error { *l = append(*l, s); return nil }

// installCmd is "vgpuctl install docker|containerd [flags]". It does not
// use the mediator's socket. Flags may come before or after the engine.
func installCmd(_ string, args []string) error {
	return installTo(os.Stdout, args)
}

// installArgs are install's flags.
type installArgs struct {
	config, runtimePath *string
	dryRun              *bool
	tenants             tenantList
}

func installFlags() (*flag.FlagSet, *installArgs) {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error says what is wrong; help is vgpuctl's
	a := &installArgs{}
	a.config = fs.String("config", "", "configuration file to edit (default "+integration.DefaultDockerConfig+" or "+integration.DefaultContainerdConfig+")")
	a.runtimePath = fs.String("runtime-path", integration.DefaultRuntimePath, "path of vgpu-runtime")
	a.dryRun = fs.Bool("dry-run", false, "print the change as a diff (or the new file); write nothing")
	fs.Var(&a.tenants, "tenant", "also add runtime vgpu-`NAME`, bound to tenant NAME (repeatable)")
	return fs, a
}

func installTo(out io.Writer, args []string) error {
	fs, a := installFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("install: which engine? docker or containerd: %w", api.ErrInvalidArgument)
	}
	engine := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("install %s: unexpected argument %q: %w", engine, fs.Arg(0), api.ErrInvalidArgument)
	}
	opts := integration.InstallOptions{
		ConfigPath:  *a.config,
		RuntimePath: *a.runtimePath,
		Tenants:     a.tenants,
		DryRun:      *a.dryRun,
	}
	var (
		r   *integration.Result
		err error
	)
	switch engine {
	case "docker":
		r, err = integration.InstallDocker(opts)
	case "containerd":
		r, err = integration.InstallContainerd(opts)
	default:
		return fmt.Errorf("install: unknown engine %q (docker or containerd): %w", engine, api.ErrInvalidArgument)
	}
	if err != nil {
		var ce *integration.ConfigError
		if errors.As(err, &ce) {
			return fmt.Errorf("%w (nothing was changed)", err)
		}
		return err
	}
	printInstall(out, r, *a.dryRun)
	return nil
}

func printInstall(out io.Writer, r *integration.Result, dryRun bool) {
	if dryRun && r.Changed {
		if r.Existed {
			fmt.Fprintf(out, "dry run: %s is not changed; the change would be:\n\n%s\n", r.Path, r.Diff())
		} else {
			fmt.Fprintf(out, "dry run: %s does not exist; it would be created as:\n\n%s\n", r.Path, r.After)
		}
	}
	for _, a := range r.Actions {
		fmt.Fprintf(out, "%s: %s\n", r.Path, a)
	}
	switch {
	case !r.Changed:
		fmt.Fprintf(out, "%s: already up to date, nothing written; nothing to restart\n", r.Path)
	case r.Written && !r.Existed:
		fmt.Fprintf(out, "%s: created\n", r.Path)
	case r.Written:
		fmt.Fprintf(out, "%s: written\n", r.Path)
	}
	if r.Backup != "" {
		fmt.Fprintf(out, "%s: the previous file is kept as %s\n", r.Path, r.Backup)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	if r.Restart != "" {
		if dryRun {
			fmt.Fprintf(out, "after a real run, load the change with:\n    %s\n", r.Restart)
		} else {
			fmt.Fprintf(out, "load the change with:\n    %s\n", r.Restart)
		}
	}
}
