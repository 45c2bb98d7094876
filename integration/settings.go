package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vgpu/vgpu/api"
	runtimehook "github.com/vgpu/vgpu/runtime-hook"
)

// Change is a file an install puts in place besides the engine's
// configuration: the runtime settings file, or a tenant's runtime link.
type Change struct {
	// Path is the file or link.
	Path string
	// Action says what was (on a dry run: would be) done, or that it was
	// in place already.
	Action string
	// Changed tells whether it differs (differed) from what was there.
	Changed bool
	// Before and After are a file's contents (nil for a link; Before nil
	// for a file that did not exist).
	Before, After []byte
	// Target is a link's target ("" for a file).
	Target string
}

// extras are the settings file and links of one install, worked out
// before anything is written so that a conflict changes nothing.
type extras struct {
	settings *Change
	links    []Change
	notes    []string
}

// planExtras works out the runtime settings file and the tenants' links
// for rts (nothing when opts.SettingsPath is ""). The settings file keeps
// the runtimes it has that rts do not name, and, where opts leave the
// socket or the state directory empty, the value a runtime had there.
// A file that is there but does not parse, or a link path taken by
// something that is not a link to vgpu-runtime (a copy, a wrapper script
// that may lose argv[0]), is an error and nothing is written.
func planExtras(opts InstallOptions, rts []Runtime) (*extras, error) {
	x := &extras{}
	if opts.SettingsPath == "" {
		return x, nil
	}
	for _, p := range []struct{ flag, v string }{{"socket", opts.Socket}, {"state directory", opts.StateDir}, {"settings file", opts.SettingsPath}} {
		if p.v != "" && !filepath.IsAbs(p.v) {
			return nil, fmt.Errorf("%s %q: want an absolute path: %w", p.flag, p.v, api.ErrInvalidArgument)
		}
	}
	path, before, existed, err := readConfig(opts.SettingsPath)
	if err != nil {
		return nil, err
	}
	cur := &runtimehook.SettingsFile{}
	if existed {
		if cur, err = runtimehook.ParseSettingsFile(path, before); err != nil {
			return nil, fmt.Errorf("%w (fix or remove it; nothing was changed)", err)
		}
	}
	next := &runtimehook.SettingsFile{Runtimes: map[string]runtimehook.RuntimeSettings{}}
	for name, rt := range cur.Runtimes {
		next.Runtimes[name] = rt
	}
	for _, rt := range rts {
		old := cur.Runtimes[rt.Name]
		s := runtimehook.RuntimeSettings{Binary: rt.Binary, Tenant: rt.Tenant, Socket: opts.Socket, StateDir: opts.StateDir}
		if s.Socket == "" {
			s.Socket = old.Socket
		}
		if s.StateDir == "" {
			s.StateDir = old.StateDir
		}
		next.Runtimes[rt.Name] = s
	}
	after, err := next.Encode()
	if err != nil {
		return nil, err
	}
	// The merged file must be one vgpu-runtime reads: a runtime kept from
	// the old file may share a binary name with one of rts.
	if _, err := runtimehook.ParseSettingsFile(path, after); err != nil {
		return nil, fmt.Errorf("%w (nothing was changed)", err)
	}
	sc := &Change{Path: path, After: after}
	switch {
	case !existed:
		sc.Changed, sc.Action = true, "created: runtime settings for "+runtimeNames(rts)
	case equalSettings(cur, next):
		sc.After, sc.Action = before, "runtime settings already in place"
	default:
		sc.Before, sc.Changed, sc.Action = before, true, "updated: runtime settings for "+runtimeNames(rts)
	}
	x.settings = sc
	if filepath.Clean(opts.SettingsPath) != runtimehook.DefaultSettingsFile {
		x.notes = append(x.notes, fmt.Sprintf("vgpu-runtime reads %s unless told otherwise: give the engine's daemon (and so its runtimes) %s=%s in its environment",
			runtimehook.DefaultSettingsFile, runtimehook.SettingsFileEnv, opts.SettingsPath))
	}

	for _, rt := range rts {
		if rt.Tenant == "" {
			continue
		}
		c, err := planLink(rt)
		if err != nil {
			return nil, err
		}
		x.links = append(x.links, c)
	}
	return x, nil
}

// equalSettings compares two files' runtimes; a file vgpuctl did not write
// (other layout, comments) that says the same is left as it is.
func equalSettings(a, b *runtimehook.SettingsFile) bool {
	if len(a.Runtimes) != len(b.Runtimes) {
		return false
	}
	for k, v := range a.Runtimes {
		if w, ok := b.Runtimes[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func runtimeNames(rts []Runtime) string {
	names := make([]string, len(rts))
	for i, rt := range rts {
		names[i] = rt.Name
	}
	return strings.Join(names, ", ")
}

// planLink works out the link rt.Binary -> rt.Path.
func planLink(rt Runtime) (Change, error) {
	c := Change{Path: rt.Binary, Target: rt.Path}
	fi, err := os.Lstat(rt.Binary)
	if errors.Is(err, fs.ErrNotExist) {
		c.Changed, c.Action = true, fmt.Sprintf("created: link to %s, runtime %q of tenant %q", rt.Path, rt.Name, rt.Tenant)
		return c, nil
	}
	if err != nil {
		return c, fileError("stat", rt.Binary, err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		// A copy of vgpu-runtime or a wrapper script the operator made:
		// a script may run the runtime under a name that is not its own,
		// and the settings file makes both unneeded.
		kind := "file"
		if fi.IsDir() {
			kind = "directory"
		}
		return c, fmt.Errorf("%s is a %s, not a link to %s: runtime %q needs the link, by whose name vgpu-runtime knows the tenant; a wrapper script that does not keep argv[0] (exec -a) runs the runtime's containers as another tenant, and the runtime settings file now holds what such a script passed; remove it and run install again (nothing was changed): %w",
			rt.Binary, kind, rt.Path, rt.Name, api.ErrInvalidArgument)
	}
	target, err := os.Readlink(rt.Binary)
	if err != nil {
		return c, fileError("read link", rt.Binary, err)
	}
	if target == rt.Path || sameFile(rt.Binary, rt.Path) {
		c.Action = fmt.Sprintf("link to %s already in place", rt.Path)
		return c, nil
	}
	c.Changed, c.Action = true, fmt.Sprintf("updated: link to %s (was to %s), runtime %q of tenant %q", rt.Path, target, rt.Name, rt.Tenant)
	return c, nil
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// apply writes what planExtras worked out and records it in r.
func (x *extras) apply(r *Result, dryRun bool) error {
	if x.settings != nil {
		if x.settings.Changed && !dryRun {
			if err := writeFileAtomic(x.settings.Path, x.settings.After, 0o644); err != nil {
				return err
			}
		}
		r.Also = append(r.Also, *x.settings)
	}
	for _, l := range x.links {
		if l.Changed && !dryRun {
			if err := replaceSymlink(l.Target, l.Path); err != nil {
				return err
			}
		}
		r.Also = append(r.Also, l)
	}
	r.Notes = append(r.Notes, x.notes...)
	return nil
}

// replaceSymlink makes path a symlink to target, atomically: a new link
// beside it is renamed over whatever link was there.
func replaceSymlink(target, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fileError("create directory", filepath.Dir(path), err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".vgpu-link")
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fileError("create link", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fileError("rename link over", path, err)
	}
	return nil
}

// Diff is a Change's unified diff ("" for a link or no change).
func (c *Change) Diff() string {
	if !c.Changed || c.After == nil {
		return ""
	}
	from := c.Path
	if c.Before == nil {
		from = "/dev/null"
	}
	return unifiedDiff(from, c.Path, c.Before, c.After)
}
