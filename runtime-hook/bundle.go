package runtimehook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// EditBundle does the wrapper's work on a call that makes a container from
// a bundle (FromBundle): it reads the bundle's config.json and, if the
// container asks for a vGPU, makes its socket directory and rewrites
// config.json through the Attach chain. It reports whether it rewrote the
// file; a container that asks for nothing is left alone, byte for byte,
// and a failure leaves no socket directory behind. A restore of a
// container that asks for a vGPU is refused: the checkpoint holds neither
// its device memory nor its sessions. inv must have had Settings applied.
func EditBundle(inv *Invocation) (bool, error) {
	bundle := inv.Bundle
	if bundle == "" {
		bundle = "."
	}
	bundle, err := filepath.Abs(bundle)
	if err != nil {
		return false, fmt.Errorf("bundle %q: %v: %w", inv.Bundle, err, api.ErrInvalidArgument)
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := readConfig(cfgPath)
	if err != nil {
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return false, fmt.Errorf("container %s: %s: %v: %w", inv.ID, cfgPath, err, api.ErrInvalidArgument)
	}
	req, err := ParseRequest(&spec, inv.Tenant)
	if err != nil {
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	if req == nil {
		return false, nil
	}
	if inv.Command == "restore" {
		return false, fmt.Errorf("container %s: it asks for a vGPU, which runc restore cannot bring back (a checkpoint holds neither its device memory nor its mediator sessions); create it anew: %w",
			inv.ID, api.ErrInvalidArgument)
	}
	// Re-encoding drops what specs.Spec does not know: refuse rather
	// than lose a setting (a security one, say) without a word.
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(&specs.Spec{}); err != nil {
		return false, fmt.Errorf("container %s: %s has fields this runtime-spec version does not know, so it cannot be rewritten without losing them: %v: %w",
			inv.ID, cfgPath, err, api.ErrInvalidArgument)
	}
	if _, err := vocab.ParseContainerID(inv.ID); err != nil {
		return false, err
	}
	if err := inv.CheckHook(); err != nil {
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	// The spec is edited in memory first: a refusal there leaves nothing
	// on the host.
	a := Attach{Request: req, ID: inv.ID, Namespace: inv.Namespace(), Socket: inv.Socket, Hook: inv.Hook, StateDir: inv.StateDir, Smi: inv.Smi}
	if err := a.Modifiers().Modify(&spec); err != nil {
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	dir, err := PrepareSocketDir(inv.StateDir, inv.Namespace(), inv.ID)
	if err != nil {
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	if err := WriteSpec(cfgPath, &spec); err != nil {
		// runc will not run, so no poststop hook will remove the directory.
		// os.Remove takes it only when empty: one that holds a socket is
		// another container's, should the id be in use.
		os.Remove(dir)
		return false, fmt.Errorf("container %s: %w", inv.ID, err)
	}
	return true, nil
}

// PrepareSocketDir makes the socket directory of container id of
// namespace, stateDir/namespace/id (SocketDir), and its namespace's
// directory, mode 0755 (owned by the caller: root, in production), and
// returns it. Directories left from an earlier run are reused; anything
// else in their place (a symlink, a file) is refused, and nothing outside
// stateDir is touched (os.Root).
func PrepareSocketDir(stateDir, namespace, id string) (string, error) {
	if _, err := vocab.ParseContainerID(id); err != nil {
		return "", err
	}
	if err := vocab.ValidNamespace(namespace); err != nil {
		return "", fmt.Errorf("container %s: %w", id, err)
	}
	if !filepath.IsAbs(stateDir) {
		return "", fmt.Errorf("state directory %q: want an absolute path: %w", stateDir, api.ErrInvalidArgument)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return "", fmt.Errorf("state directory: %v: %w", err, api.ErrInternal)
	}
	root, err := os.OpenRoot(stateDir)
	if err != nil {
		return "", fmt.Errorf("state directory: %v: %w", err, api.ErrInternal)
	}
	defer root.Close()
	rel := SocketDir(".", namespace, id)
	for _, p := range []string{filepath.Dir(rel), rel} {
		if err := plainDir(root, p); err != nil {
			return "", err
		}
	}
	return SocketDir(stateDir, namespace, id), nil
}

// plainDir makes directory name in root, mode 0755, or checks that what is
// there is a directory (not a symlink) and gives it that mode.
func plainDir(root *os.Root, name string) error {
	dir := filepath.Join(root.Name(), name)
	if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("socket directory %s: %v: %w", dir, err, api.ErrInternal)
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return fmt.Errorf("socket directory %s: %v: %w", dir, err, api.ErrInternal)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s exists and is not a directory (%v): %w", dir, fi.Mode().Type(), api.ErrPermissionDenied)
	}
	if err := root.Chmod(name, 0o755); err != nil { // whatever the umask
		return fmt.Errorf("socket directory %s: %v: %w", dir, err, api.ErrInternal)
	}
	return nil
}

// WriteSpec replaces the file at path with spec, atomically: a temporary
// file in the same directory, synced, given the old file's mode (and owner,
// where it differs from ours), then renamed over it.
func WriteSpec(path string, spec *specs.Spec) (err error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode %s: %v: %w", path, err, api.ErrInternal)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("write %s: %v: %w", path, err, api.ErrInternal)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config.json.vgpu-*")
	if err != nil {
		return fmt.Errorf("write %s: %v: %w", path, err, api.ErrInternal)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("write %s: %v: %w", path, err, api.ErrInternal)
		}
	}()
	if _, err = tmp.Write(b); err != nil {
		return err
	}
	if err = tmp.Chmod(fi.Mode().Perm()); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
		if err = tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ReportError writes err where the caller of a runtime looks for it: to
// stderr, and to runc's --log file in its --log-format (json or text), the
// last error line of which containerd shows for a failed create.
func (inv *Invocation) ReportError(stderr io.Writer, err error) {
	inv.report(stderr, "vgpu-runtime: "+err.Error())
}

// report writes msg as ReportError does.
func (inv *Invocation) report(stderr io.Writer, msg string) {
	fmt.Fprintln(stderr, msg)
	if inv == nil || inv.Log == "" {
		return
	}
	// O_NONBLOCK: should the log be a FIFO nobody reads, fail, do not hang.
	f, ferr := os.OpenFile(inv.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o644)
	if ferr != nil {
		fmt.Fprintf(stderr, "vgpu-runtime: log %s: %v\n", inv.Log, ferr)
		return
	}
	defer f.Close()
	l := logrus.New()
	l.SetOutput(f)
	if inv.LogFormat == "json" {
		l.SetFormatter(&logrus.JSONFormatter{})
	} else {
		l.SetFormatter(&logrus.TextFormatter{DisableColors: true, FullTimestamp: true})
	}
	l.Error(msg)
}
