package runtimehook

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
)

// HookEnv is the whole environment vgpu-hook runs with. It is set in the
// spec because runc would otherwise give the hook its own environment.
var HookEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}

// HookTimeout is the hook's timeout in the spec, in seconds: runc kills it
// then. HookDeadline is when the hook gives up by itself, a little earlier,
// so that it can say why.
const (
	HookTimeout  = 10
	HookDeadline = 8 * time.Second
)

// maxStateJSON bounds the OCI state read from the hook's stdin, and
// maxConfigJSON a bundle's config.json.
const (
	maxStateJSON  = 1 << 20
	maxConfigJSON = 64 << 20
)

// SocketDir is the socket directory of container id of namespace in
// stateDir: stateDir/namespace/id (vocab.HostSocketDir).
func SocketDir(stateDir, namespace, id string) string {
	return vocab.HostSocketDir(stateDir, namespace, id)
}

// HookConfig is vgpu-hook's command line, typed: what the wrapper tells the
// hook when it installs it. Args and ParseHookArgs are inverses.
type HookConfig struct {
	Stage     HookStage
	Socket    string // the mediator's operator socket
	Namespace string // containerd namespace: with the id, names the container
	Tenant    string // createRuntime only; "": the mediator decides
	Memory    uint64 // createRuntime only
	Compute   uint32 // createRuntime only
	Devices   uint32 // createRuntime only
	SocketDir string // the container's socket directory on the host
	StateDir  string // the directory that holds all of them
}

// Args returns the hook's argv, program name first.
func (c HookConfig) Args() []string {
	args := []string{"vgpu-hook", string(c.Stage), "--socket", c.Socket, "--namespace", c.Namespace}
	if c.Stage == StageCreateRuntime {
		args = append(args,
			"--tenant", c.Tenant,
			"--memory", strconv.FormatUint(c.Memory, 10),
			"--compute", strconv.FormatUint(uint64(c.Compute), 10),
			"--devices", strconv.FormatUint(uint64(c.Devices), 10))
	}
	return append(args, "--socket-dir", c.SocketDir, "--state-dir", c.StateDir)
}

// Spec returns the OCI hook that runs vgpu-hook, at hookPath, with c: a
// fixed environment and a timeout.
func (c HookConfig) Spec(hookPath string) specs.Hook {
	t := HookTimeout
	return specs.Hook{Path: hookPath, Args: c.Args(), Env: append([]string(nil), HookEnv...), Timeout: &t}
}

// ParseHookArgs reads the hook's argv (program name first) and checks it.
func ParseHookArgs(argv []string) (*HookConfig, error) {
	if len(argv) < 2 {
		return nil, fmt.Errorf("usage: vgpu-hook %s|%s --socket PATH --socket-dir DIR --state-dir DIR ...: %w",
			StageCreateRuntime, StagePoststop, api.ErrInvalidArgument)
	}
	c := &HookConfig{Stage: HookStage(argv[1])}
	fs := flag.NewFlagSet("vgpu-hook "+argv[1], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Socket, "socket", "", "the mediator's operator socket")
	fs.StringVar(&c.SocketDir, "socket-dir", "", "the container's socket directory")
	fs.StringVar(&c.StateDir, "state-dir", "", "the directory of socket directories")
	fs.StringVar(&c.Namespace, "namespace", "", "containerd namespace")
	var devices, compute uint64
	switch c.Stage {
	case StageCreateRuntime:
		fs.StringVar(&c.Tenant, "tenant", "", "the operator's tenant")
		fs.Uint64Var(&c.Memory, "memory", 0, "bytes")
		fs.Uint64Var(&compute, "compute", 0, "weight")
		fs.Uint64Var(&devices, "devices", 1, "virtual devices")
	case StagePoststop:
	default:
		return nil, fmt.Errorf("hook stage %q: want %s or %s: %w", argv[1], StageCreateRuntime, StagePoststop, api.ErrInvalidArgument)
	}
	if err := fs.Parse(argv[2:]); err != nil {
		return nil, fmt.Errorf("vgpu-hook %s: %v: %w", c.Stage, err, api.ErrInvalidArgument)
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("vgpu-hook %s: unexpected argument %q: %w", c.Stage, fs.Arg(0), api.ErrInvalidArgument)
	}
	if compute > 1<<32-1 || devices > 1<<32-1 {
		return nil, fmt.Errorf("vgpu-hook: --compute %d or --devices %d out of range: %w", compute, devices, api.ErrInvalidArgument)
	}
	c.Compute, c.Devices = uint32(compute), uint32(devices)
	for _, p := range []struct{ name, v string }{{"--socket", c.Socket}, {"--socket-dir", c.SocketDir}, {"--state-dir", c.StateDir}} {
		if !path.IsAbs(p.v) || path.Clean(p.v) != p.v {
			return nil, fmt.Errorf("vgpu-hook %s: %s %q: want a clean absolute path: %w", c.Stage, p.name, p.v, api.ErrInvalidArgument)
		}
	}
	if err := vocab.ValidNamespace(c.Namespace); err != nil {
		return nil, fmt.Errorf("vgpu-hook %s: --namespace: %w", c.Stage, err)
	}
	if want := SocketDir(c.StateDir, c.Namespace, path.Base(c.SocketDir)); c.SocketDir != want {
		return nil, fmt.Errorf("vgpu-hook %s: --socket-dir %q is not a container's directory of namespace %q in --state-dir %q (%s/<id>): %w",
			c.Stage, c.SocketDir, c.Namespace, c.StateDir, path.Dir(want), api.ErrInvalidArgument)
	}
	return c, nil
}

// ReadState reads the OCI state runc writes to a hook's stdin and checks
// the container id.
func ReadState(r io.Reader) (*specs.State, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxStateJSON+1))
	if err != nil {
		return nil, fmt.Errorf("read container state from stdin: %v: %w", err, api.ErrInvalidArgument)
	}
	if len(b) > maxStateJSON {
		return nil, fmt.Errorf("container state on stdin exceeds %d bytes: %w", maxStateJSON, api.ErrInvalidArgument)
	}
	var st specs.State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("container state on stdin: %v: %w", err, api.ErrInvalidArgument)
	}
	if _, err := vocab.ParseContainerID(st.ID); err != nil {
		return nil, fmt.Errorf("container state on stdin: %w", err)
	}
	if st.Pid < 0 || st.Pid > 1<<32-1 {
		return nil, fmt.Errorf("container state on stdin: pid %d: %w", st.Pid, api.ErrInvalidArgument)
	}
	return &st, nil
}

// readConfig reads the config.json at path whole, refusing one of more
// than maxConfigJSON bytes: the wrapper and the hook both hold it in memory.
func readConfig(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, api.ErrInvalidArgument)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigJSON+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %v: %w", path, err, api.ErrInvalidArgument)
	}
	if len(b) > maxConfigJSON {
		return nil, fmt.Errorf("%s is larger than %d bytes (%s), the most a config.json may have: %w",
			path, maxConfigJSON, api.FormatSize(maxConfigJSON), api.ErrInvalidArgument)
	}
	return b, nil
}

// ReadBundle returns what the hook needs of the bundle's config.json: the
// root filesystem (root.path, relative to the bundle unless absolute) and
// the mounts, in the order runc makes them.
func ReadBundle(bundle string) (rootfs string, mounts []specs.Mount, err error) {
	raw, err := readConfig(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", nil, fmt.Errorf("bundle %s: %w", bundle, err)
	}
	var cfg struct {
		Root   *specs.Root   `json:"root"`
		Mounts []specs.Mount `json:"mounts"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return "", nil, fmt.Errorf("bundle %s: config.json: %v: %w", bundle, err, api.ErrInvalidArgument)
	}
	if cfg.Root == nil || cfg.Root.Path == "" {
		return "", nil, fmt.Errorf("bundle %s: config.json has no root.path: %w", bundle, api.ErrInvalidArgument)
	}
	if filepath.IsAbs(cfg.Root.Path) {
		return filepath.Clean(cfg.Root.Path), cfg.Mounts, nil
	}
	return filepath.Join(bundle, cfg.Root.Path), cfg.Mounts, nil
}

// CheckMountPoint checks that vocab.InContainerSocketDir in the container is the
// directory mounted there, where its VGPU_SOCKET says, as far as the image
// and the spec decide it; runc makes mounts in order, the socket
// directory's last (SocketMount):
//   - in the image, vocab.InContainerSocketDir resolves, without leaving rootfs,
//     to the plain path below it: no component the image put there is a
//     symlink. Components that do not exist yet are fine: runc makes them.
//   - no other mount is above it (at /run or /, directly or through the
//     image's symlinks, as /var/run often is): its contents, unseen here,
//     would decide what is there, a vgpu symlink say. Only a fresh tmpfs
//     (containerd's default /run) may be, as it starts empty.
//
// What a mount's contents hold is not seen: a destination that reaches
// /run through a symlink inside another mount is not caught.
func CheckMountPoint(rootfs string, mounts []specs.Mount) error {
	want := filepath.Join(rootfs, vocab.InContainerSocketDir)
	got, err := securejoin.SecureJoin(rootfs, vocab.InContainerSocketDir)
	if err != nil {
		return fmt.Errorf("resolve %s in root filesystem %s: %v: %w", vocab.InContainerSocketDir, rootfs, err, api.ErrPermissionDenied)
	}
	if got != want {
		return fmt.Errorf("%s in root filesystem %s resolves through a symlink to %s; refusing to mount the vGPU socket there: %w",
			vocab.InContainerSocketDir, rootfs, got, api.ErrPermissionDenied)
	}
	for _, m := range mounts {
		dst, err := securejoin.SecureJoin(rootfs, m.Destination)
		if err != nil {
			return fmt.Errorf("resolve mount destination %q in root filesystem %s: %v: %w", m.Destination, rootfs, err, api.ErrPermissionDenied)
		}
		if dst == want || !within(want, dst) || freshTmpfs(m) {
			continue
		}
		return fmt.Errorf("mount at %q (type %q, source %q) covers %s, so its contents, not the image's, decide what is there; only a fresh tmpfs may be mounted above the vGPU socket: %w",
			m.Destination, m.Type, m.Source, vocab.InContainerSocketDir, api.ErrPermissionDenied)
	}
	return nil
}

// freshTmpfs reports whether m mounts a new, empty tmpfs. runc takes any
// mount with a bind option for a bind mount, whatever its type.
func freshTmpfs(m specs.Mount) bool {
	return m.Type == "tmpfs" && !slices.ContainsFunc(m.Options, func(o string) bool { return o == "bind" || o == "rbind" })
}

// Mediator is the mediator as the hook sees it; *client.Operator is one.
type Mediator interface {
	Register(api.Register) (*api.RegisterReply, error)
	Release(namespace, container string) error
	Close() error
}

// Dialer connects to the mediator's operator socket.
type Dialer func(socket string) (Mediator, error)

// RunHook does the hook's work for cfg.Stage on the container in st, of
// namespace cfg.Namespace, and
// writes what it did to log. It gives up when ctx ends, even while the
// mediator does not answer.
//
// createRuntime checks the mount point in the container's root filesystem
// and registers the container: an admission the mediator refuses is an
// error, so the container does not start. poststop releases the container
// and removes its socket directory; a container the mediator does not know
// (it restarted, or admission failed) or a mediator that is down is logged
// and is not an error: the container is gone either way.
func RunHook(ctx context.Context, cfg *HookConfig, st *specs.State, dial Dialer, log io.Writer) error {
	if path.Base(cfg.SocketDir) != st.ID {
		return fmt.Errorf("container %s (namespace %q): socket directory %s is another container's: %w", st.ID, cfg.Namespace, cfg.SocketDir, api.ErrInvalidArgument)
	}
	switch cfg.Stage {
	case StageCreateRuntime:
		return register(ctx, cfg, st, dial, log)
	case StagePoststop:
		return release(ctx, cfg, st, dial, log)
	}
	return fmt.Errorf("hook stage %q: %w", cfg.Stage, api.ErrInvalidArgument)
}

func register(ctx context.Context, cfg *HookConfig, st *specs.State, dial Dialer, log io.Writer) error {
	rootfs, mounts, err := ReadBundle(st.Bundle)
	if err != nil {
		return fmt.Errorf("container %s: %w", st.ID, err)
	}
	if err := CheckMountPoint(rootfs, mounts); err != nil {
		return fmt.Errorf("container %s: %w", st.ID, err)
	}
	req := api.Register{
		Container: st.ID,
		Namespace: cfg.Namespace,
		Tenant:    cfg.Tenant,
		Memory:    cfg.Memory,
		Compute:   cfg.Compute,
		Devices:   cfg.Devices,
		Pid:       uint32(st.Pid),
		SocketDir: cfg.SocketDir,
	}
	reply, err := Register(ctx, cfg.Socket, dial, req)
	if err != nil {
		if rerr := RemoveSocketDir(cfg.StateDir, cfg.SocketDir); rerr != nil {
			fmt.Fprintf(log, "vgpu-hook: container %s: %v\n", st.ID, rerr)
		}
		req := fmt.Sprintf("register container %s (namespace %q, tenant %q, memory %d, compute %d, devices %d)",
			st.ID, cfg.Namespace, cfg.Tenant, cfg.Memory, cfg.Compute, cfg.Devices)
		if rerr, ok := errors.AsType[*api.RemoteError](err); ok {
			return &RefusedError{Reason: rerr.Msg, Request: req, Err: err}
		}
		return fmt.Errorf("%s: %w", req, err)
	}
	fmt.Fprintf(log, "vgpu-hook: container %s registered: tenant %q, memory %s, socket %s\n",
		st.ID, reply.Tenant, api.FormatSize(reply.Memory), reply.Socket)
	return nil
}

// Register registers req with the mediator at socket, again, while the
// connection was lost before an answer, the hello's too — until ctx ends,
// or HookDeadline has passed: a mediator that hands over to its successor
// (vgpuctl upgrade) closes its connections, those it accepted and had not
// yet greeted among them, and the successor takes the next one from the
// same socket. The mediator answers a repeated registration as the first,
// should that one have been made. A refusal, or a socket that nobody
// listens on (none there, or connections refused), is not tried again.
func Register(ctx context.Context, socket string, dial Dialer, req api.Register) (*api.RegisterReply, error) {
	deadline := time.Now().Add(HookDeadline)
	for {
		var reply *api.RegisterReply
		err := withMediator(ctx, socket, dial, func(m Mediator) error {
			var err error
			reply, err = m.Register(req)
			return err
		})
		if err == nil {
			return reply, nil
		}
		_, refused := errors.AsType[*api.RemoteError](err)
		if refused || notListening(err) || !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			return nil, err // reply is still the abandoned call's
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(registerRetry):
		}
	}
}

// notListening says whether a dial failed for want of a listener on the
// socket, rather than on a connection a listener took and then closed.
func notListening(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// registerRetry is the pause before a registration is tried again.
const registerRetry = 50 * time.Millisecond

func release(ctx context.Context, cfg *HookConfig, st *specs.State, dial Dialer, log io.Writer) error {
	err := withMediator(ctx, cfg.Socket, dial, func(m Mediator) error { return m.Release(cfg.Namespace, st.ID) })
	rerr := RemoveSocketDir(cfg.StateDir, cfg.SocketDir)
	switch {
	case err == nil:
		fmt.Fprintf(log, "vgpu-hook: container %s released (namespace %q)\n", st.ID, cfg.Namespace)
	case errors.Is(err, api.ErrInvalidArgument), errors.Is(err, api.ErrUnavailable):
		// Unknown to the mediator, or the mediator is not there: nothing is held.
		fmt.Fprintf(log, "vgpu-hook: container %s (namespace %q): release: %v (ignored)\n", st.ID, cfg.Namespace, err)
		err = nil
	default:
		err = fmt.Errorf("release container %s (namespace %q): %w", st.ID, cfg.Namespace, err)
	}
	if rerr != nil {
		return errors.Join(err, fmt.Errorf("container %s: %w", st.ID, rerr))
	}
	return err
}

// withMediator dials the mediator and runs fn on the connection, giving up
// when ctx ends: the connection is then closed, which fails fn's call.
func withMediator(ctx context.Context, socket string, dial Dialer, fn func(Mediator) error) error {
	var (
		mu        sync.Mutex
		conn      Mediator
		abandoned bool
	)
	done := make(chan error, 1)
	go func() {
		m, err := dial(socket)
		if err != nil {
			done <- err
			return
		}
		mu.Lock()
		if abandoned {
			mu.Unlock()
			m.Close()
			done <- ctx.Err()
			return
		}
		conn = m
		mu.Unlock()
		done <- fn(m)
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = fmt.Errorf("mediator at %s did not answer in time: %v: %w", socket, ctx.Err(), api.ErrUnavailable)
	}
	mu.Lock()
	abandoned = true
	if conn != nil {
		conn.Close()
	}
	mu.Unlock()
	return err
}

// RemoveSocketDir removes a container's socket directory: only a directory
// stateDir/namespace/id (SocketDir) with a plain namespace (or
// vocab.NoNamespace) and a plain container id for names, neither of them a
// symlink, and never anything outside stateDir (os.Root). One that is gone
// already is fine. The namespace's directory stays.
func RemoveSocketDir(stateDir, dir string) error {
	nsDir := filepath.Dir(dir)
	ns := filepath.Base(nsDir)
	if ns == vocab.NoNamespace {
		ns = ""
	}
	_, badID := vocab.ParseContainerID(filepath.Base(dir))
	if filepath.Dir(nsDir) != filepath.Clean(stateDir) || vocab.ValidNamespace(ns) != nil || badID != nil {
		return fmt.Errorf("socket directory %s is not a container's directory in %s; not removing it: %w",
			dir, stateDir, api.ErrPermissionDenied)
	}
	root, err := os.OpenRoot(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state directory: %v: %w", err, api.ErrInternal)
	}
	defer root.Close()
	rel := filepath.Join(filepath.Base(nsDir), filepath.Base(dir))
	for _, p := range []string{filepath.Dir(rel), rel} {
		fi, err := root.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("socket directory %s: %v: %w", dir, err, api.ErrInternal)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory (%v); not removing socket directory %s: %w",
				filepath.Join(stateDir, p), fi.Mode().Type(), dir, api.ErrPermissionDenied)
		}
	}
	if err := root.RemoveAll(rel); err != nil {
		return fmt.Errorf("remove socket directory: %v: %w", err, api.ErrInternal)
	}
	return nil
}
