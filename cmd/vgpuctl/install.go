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
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

const installUsage = `usage: vgpuctl install docker|containerd [--config PATH] [--runtime-path PATH] [--tenant NAME]...
                       [--mediator-socket PATH] [--state-dir DIR] [--settings PATH] [--dry-run]

Adds the OCI runtime "vgpu" (and "vgpu-NAME" per --tenant, bound to that
tenant) to Docker's daemon.json or containerd's config.toml, keeping every
other setting; writes vgpu-runtime's settings file (--settings), which says
by runtime name the tenant, mediator socket and state directory, and makes
the tenants' runtime links RUNTIME-PATH-NAME. Running it again changes
nothing. It prints what to restart.
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
	settings            *string
	socket, stateDir    *string
}

func installFlags() (*flag.FlagSet, *installArgs) {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error says what is wrong; help is vgpuctl's
	a := &installArgs{}
	a.config = fs.String("config", "", "configuration file to edit (default "+integration.DefaultDockerConfig+" or "+integration.DefaultContainerdConfig+")")
	a.runtimePath = fs.String("runtime-path", integration.DefaultRuntimePath, "path of vgpu-runtime")
	a.dryRun = fs.Bool("dry-run", false, "print the change as a diff (or the new file); write nothing")
	fs.Var(&a.tenants, "tenant", "also add runtime vgpu-`NAME`, bound to tenant NAME (repeatable)")
	a.settings = fs.String("settings", runtimehook.DefaultSettingsFile, "vgpu-runtime's settings file to write (vgpu-runtime reads $"+runtimehook.SettingsFileEnv+" or this default)")
	// Not --socket: that global flag is the mediator vgpuctl talks to.
	a.socket = fs.String("mediator-socket", "", "the mediator socket the runtimes use (default: as the settings file has it, else "+runtimehook.DefaultOperatorSocket+")")
	a.stateDir = fs.String("state-dir", "", "where the runtimes make containers' socket directories (default: as the settings file has it, else "+runtimehook.DefaultStateDir+")")
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
		ConfigPath:   *a.config,
		RuntimePath:  *a.runtimePath,
		Tenants:      a.tenants,
		DryRun:       *a.dryRun,
		SettingsPath: *a.settings,
		Socket:       *a.socket,
		StateDir:     *a.stateDir,
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
	for _, c := range r.Also {
		if diff := c.Diff(); dryRun && diff != "" {
			fmt.Fprintf(out, "dry run: %s would change:\n\n%s\n", c.Path, diff)
		}
		action := c.Action
		if dryRun && c.Changed {
			action = "would be " + action
		}
		fmt.Fprintf(out, "%s: %s\n", c.Path, action)
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
