package root

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// dirPrefix names the run's directory in /tmp. It is short on purpose:
// the run's own sockets (containerd's, dockerd's, the mediator's) must fit
// in sun_path (108 bytes). Containers' sockets,
// <dir>/c/<namespace>/<64-hex-id>/mediator.sock, may not; the mediator
// binds them through their directory.
const dirPrefix = "vgpu-e2e-"

// Image names and the tenants of the quota file.
const (
	dockerImage = "vgpu-e2e:latest"
	ctrImage    = "docker.io/vgpu/e2e:latest" // the OCI archive's image, for the containerd client
	ctrNS       = "vgpu-e2e"                  // containerd namespace of the client test
)

// quotaFile defines the tenants. Docker's namespace "moby" maps to team-a;
// team-b is named by the runtime (vgpu-runtime-team-b, --vgpu-tenant
// team-b); everything else falls to team-c.
const quotaFile = `default_tenant = "team-c"

[namespaces]
moby = "team-a"

[tenants.team-a]
memory = "512MiB"
max_containers = 4
default_memory = "64MiB"

[tenants.team-b]
memory = "256MiB"
max_containers = 2
default_memory = "64MiB"

[tenants.team-c]
memory = "128MiB"
max_containers = 1
default_memory = "32MiB"
`

// harness is the private world of one run: daemons, binaries, images.
type harness struct {
	dir       string           // /tmp/vgpu-e2e-NNN, everything lives below
	bin       string           // vgpu binaries
	missing   map[string]error // vgpu binaries that did not build, by name
	runc      string           // the real runc
	dockerBin string           // the docker CLI
	rootfs    string           // the test image's root filesystem
	tarball   string           // rootfs as a tar, for docker import and the OCI layer

	ctdSock, ctdState string // containerd
	dockerSock        string // dockerd's API
	dockerEnv         []string
	medSock, ctrDir   string // mediator socket; containers' socket directories (= vgpu-runtime's --vgpu-state)
	settings          string // vgpu-runtime's settings file: containerd's $VGPU_RUNTIME_CONFIG, absent unless a test installs it
	fifoDir           string // containerd client's stdio fifos
	runcRoots         string // --root directories of runc containers the tests drive directly
	mediatorErr       error  // vgpu-node, vgpu-mediator or vgpuctl is not up

	nodeAddr, quota string  // the mediator's node and quota file
	med             *daemon // the mediator running now

	daemons []*daemon // in start order
}

func newHarness() (*harness, error) {
	dir, err := os.MkdirTemp("/tmp", dirPrefix)
	if err != nil {
		return nil, err
	}
	h := &harness{
		dir:       dir,
		bin:       filepath.Join(dir, "bin"),
		missing:   map[string]error{},
		rootfs:    filepath.Join(dir, "rootfs"),
		tarball:   filepath.Join(dir, "rootfs.tar"),
		ctdSock:   filepath.Join(dir, "ctd.sock"),
		ctdState:  filepath.Join(dir, "cs"),
		medSock:   filepath.Join(dir, "m.sock"),
		ctrDir:    filepath.Join(dir, "c"),
		settings:  filepath.Join(dir, "runtime.toml"),
		fifoDir:   filepath.Join(dir, "fifo"),
		runcRoots: filepath.Join(dir, "runc"),
	}
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return h, err
	}
	for _, d := range []string{h.bin, "logs", h.ctrDir, h.fifoDir, h.runcRoots} {
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return h, err
		}
	}
	h.runc, _ = exec.LookPath("runc")
	h.dockerBin, _ = exec.LookPath("docker")
	if err := h.build(); err != nil {
		return h, err
	}
	if err := h.startContainerd(); err != nil {
		return h, err
	}
	if err := h.startDockerd(); err != nil {
		return h, err
	}
	if out, err := h.dockerCmd(context.Background(), "import", "--change", "ENV PATH=/bin", h.tarball, dockerImage); err != nil {
		return h, fmt.Errorf("docker import: %v\n%s", err, out)
	}
	h.mediatorErr = h.startMediator()
	return h, nil
}

// vgpuCommands are built from cmd/; vgpu-runtime, vgpu-hook and vgpu-smi
// static, as they are installed (the hook runs as root on the host,
// vgpu-smi in any container's image).
var vgpuCommands = []struct {
	name   string
	static bool
}{
	{"vgpu-node", false}, {"vgpu-mediator", false}, {"vgpuctl", false},
	{"vgpu-runtime", true}, {"vgpu-hook", true}, {"vgpu-smi", true},
}

// build builds the vgpu binaries (a failure is recorded per binary: the
// tests that need it fail, the others run) and writes the test image's root
// filesystem with the static test programs (a failure there stops all).
func (h *harness) build() error {
	if pre := os.Getenv(binEnv); pre != "" {
		h.bin = pre
		for _, c := range vgpuCommands {
			if _, err := os.Stat(h.binPath(c.name)); err != nil {
				h.missing[c.name] = fmt.Errorf("%w: %s=%s: %v", errNotBuilt, binEnv, pre, err)
			}
		}
	} else {
		for _, c := range vgpuCommands {
			if out, err := goBuild(h.binPath(c.name), "./cmd/"+c.name, c.static); err != nil {
				h.missing[c.name] = fmt.Errorf("%w: %v\n%s", errNotBuilt, err, tail([]byte(out), 15))
			}
		}
	}
	if err := writeRootfs(h.rootfs); err != nil {
		return err
	}
	for _, p := range []struct{ name, pkg string }{{"tenant", "./examples/tenant"}, {"testimage", "./e2e/testimage"}} {
		dst := filepath.Join(h.rootfs, p.name)
		if out, err := goBuild(dst, p.pkg, true); err != nil {
			return fmt.Errorf("build %s (static, for the image): %v\n%s", p.pkg, err, out)
		}
		if !static(dst) {
			return fmt.Errorf("%s is not static", dst)
		}
	}
	f, err := os.Create(h.tarball)
	if err != nil {
		return err
	}
	if err := tarDir(f, h.rootfs); err != nil {
		f.Close()
		return fmt.Errorf("tar %s: %w", h.rootfs, err)
	}
	return f.Close()
}

// goBuild builds the package at pkg, relative to the module root.
func goBuild(out, pkg string, static bool) (string, error) {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = moduleRoot()
	cmd.Env = os.Environ()
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// moduleRoot is two levels above this package's directory.
func moduleRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// daemon is a long-running process of the harness, logging to a file.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startDaemon starts argv in the background. It dies with the test binary
// (Pdeathsig), whatever happens to the test.
func (h *harness) startDaemon(name string, env []string, argv ...string) (*daemon, error) {
	d := &daemon{name: name, log: filepath.Join(h.dir, "logs", name+".log"), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	h.daemons = append(h.daemons, d)
	return d, nil
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, then SIGKILL after grace.
func (d *daemon) stop(grace time.Duration) {
	if d.exited() {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
		fmt.Fprintf(os.Stderr, "root e2e: %s ignored SIGTERM for %v; killing it\n", d.name, grace)
		d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) tail(n int) string {
	b, _ := os.ReadFile(d.log)
	return tail(b, n)
}

// waitUp polls ok until it holds, the daemon exits, or within passes.
func (d *daemon) waitUp(within time.Duration, ok func() bool) error {
	deadline := time.Now().Add(within)
	for !ok() {
		if d.exited() {
			return fmt.Errorf("%s exited: %v\n%s", d.name, d.cmd.ProcessState, d.tail(30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not up after %v\n%s", d.name, within, d.tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// startContainerd starts a private containerd (config version 2, CRI off).
func (h *harness) startContainerd() error {
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(h.dir, "ctd"), h.ctdState, h.ctdSock, h.ctdSock+".ttrpc", filepath.Join(h.dir, "opt"))
	path := filepath.Join(h.dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	// The shims, and so vgpu-runtime, inherit containerd's environment:
	// this keeps the host's /etc/vgpu/runtime.toml out of the tests.
	d, err := h.startDaemon("containerd", []string{"VGPU_RUNTIME_CONFIG=" + h.settings}, "containerd", "--config", path)
	if err != nil {
		return err
	}
	return d.waitUp(30*time.Second, func() bool {
		if _, err := os.Stat(h.ctdSock); err != nil {
			return false
		}
		c, err := client.New(h.ctdSock, client.WithTimeout(time.Second))
		if err != nil {
			return false
		}
		defer c.Close()
		_, err = c.Version(context.Background())
		return err == nil
	})
}

// startDockerd starts a private dockerd on the private containerd, with the
// runtime "vgpu" registered in its daemon.json.
func (h *harness) startDockerd() error {
	h.dockerSock = filepath.Join(h.dir, "d.sock")
	h.dockerEnv = []string{"DOCKER_HOST=unix://" + h.dockerSock, "DOCKER_CONFIG=" + filepath.Join(h.dir, "cli")}
	cfg := map[string]any{
		"runtimes": map[string]any{
			"vgpu": map[string]any{"path": h.binPath("vgpu-runtime"), "runtimeArgs": h.runtimeArgs()},
		},
		// dockerd 20.10 would otherwise write /etc/docker/key.json.
		"deprecated-key-path": filepath.Join(h.dir, "key.json"),
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	path := filepath.Join(h.dir, "daemon.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	d, err := h.startDaemon("dockerd", nil, "dockerd",
		"--containerd", h.ctdSock,
		"--iptables=false", "--bridge=none",
		"--data-root", filepath.Join(h.dir, "d"),
		"--exec-root", filepath.Join(h.dir, "x"),
		"-H", "unix://"+h.dockerSock,
		"--pidfile", filepath.Join(h.dir, "d.pid"),
		"--config-file", path,
		"--log-level", "warn")
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", h.dockerSock)
	}}, Timeout: 2 * time.Second}
	return d.waitUp(60*time.Second, func() bool {
		resp, err := hc.Get("http://docker/_ping")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// runtimeArgs are vgpu-runtime's own flags for this harness (Docker's
// runtimeArgs; the containerd wrapper script's).
func (h *harness) runtimeArgs() []string {
	return []string{
		"--vgpu-socket", h.medSock,
		"--vgpu-state", h.ctrDir,
		"--vgpu-hook", h.binPath("vgpu-hook"),
		"--vgpu-runtime", h.runc,
	}
}

// startMediator starts a vgpu-node with two sim devices and a vgpu-mediator
// on it, with the quota file, the container dir and the private containerd.
func (h *harness) startMediator() error {
	for _, name := range []string{"vgpu-node", "vgpu-mediator", "vgpuctl"} {
		if err := h.missing[name]; err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	node, err := h.startDaemon("vgpu-node", nil, h.binPath("vgpu-node"),
		"--listen", addr, "--devices", "2", "--memory", "2GiB", "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := node.waitUp(10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		return err
	}
	h.nodeAddr, h.quota = addr, filepath.Join(h.dir, "tenants.toml")
	if err := os.WriteFile(h.quota, []byte(quotaFile), 0o644); err != nil {
		return err
	}
	return h.serveMediator()
}

// serveMediator starts vgpu-mediator on the harness's node, with its state
// directory, as at first or again after killMediator, and waits until it
// answers (its socket may be a killed one's, left behind).
func (h *harness) serveMediator() error {
	med, err := h.startDaemon("vgpu-mediator", nil, h.binPath("vgpu-mediator"),
		"--socket", h.medSock, "--node", h.nodeAddr, "--quota", h.quota,
		"--container-dir", h.ctrDir, "--containerd", h.ctdSock, "--state-dir", filepath.Join(h.dir, "state"), "--log-level", "info")
	if err != nil {
		return err
	}
	h.med = med
	return med.waitUp(15*time.Second, func() bool {
		if _, err := os.Stat(h.medSock); err != nil {
			return false
		}
		_, err := run(context.Background(), nil, h.binPath("vgpuctl"), "--socket", h.medSock, "tenants", "--json")
		return err == nil
	})
}

// killMediator SIGKILLs the mediator and waits until it is gone: nothing of
// its own ending runs.
func (h *harness) killMediator(tb testing.TB) {
	tb.Helper()
	if err := h.med.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	<-h.med.done
}

// dockerCmd runs the docker CLI against the private dockerd.
func (h *harness) dockerCmd(ctx context.Context, args ...string) (string, error) {
	return run(ctx, h.dockerEnv, h.dockerBin, args...)
}

// docker is dockerCmd that fails the test on error.
func (h *harness) docker(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := h.dockerCmd(context.Background(), args...)
	if err != nil {
		tb.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// containerd connects to the private containerd in namespace ns.
func (h *harness) containerd(tb testing.TB, ns string) (*client.Client, context.Context) {
	tb.Helper()
	c, err := client.New(h.ctdSock, client.WithDefaultNamespace(ns))
	if err != nil {
		tb.Fatalf("containerd client: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c, namespaces.WithNamespace(context.Background(), ns)
}

func (h *harness) daemon(name string) *daemon {
	for _, d := range h.daemons {
		if d.name == name {
			return d
		}
	}
	return nil
}

// logTails logs the end of each daemon's log, for a failed test.
func (h *harness) logTails(tb testing.TB) {
	for _, d := range h.daemons {
		if t := d.tail(15); t != "" {
			tb.Logf("--- %s log (last lines) ---\n%s", d.name, t)
		}
	}
}

// close tears everything down: containers, daemons, leftover shims and
// their containers, mounts, the directory. It keeps going past errors.
func (h *harness) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if d := h.daemon("dockerd"); d != nil && !d.exited() {
		if out, err := h.dockerCmd(ctx, "ps", "-aq"); err == nil && len(lines(out)) > 0 {
			h.dockerCmd(ctx, append([]string{"rm", "-f"}, lines(out)...)...)
		}
	}
	if d := h.daemon("containerd"); d != nil && !d.exited() {
		removeAllContainers(ctx, h.ctdSock)
	}
	h.deleteRuncContainers(ctx)
	for i := len(h.daemons) - 1; i >= 0; i-- {
		h.daemons[i].stop(20 * time.Second)
	}
	cleanupDir(h.dir)
}

// removeAllContainers kills and deletes every task and container of every
// namespace of the containerd at sock.
func removeAllContainers(ctx context.Context, sock string) {
	c, err := client.New(sock, client.WithTimeout(5*time.Second))
	if err != nil {
		return
	}
	defer c.Close()
	nss, _ := c.NamespaceService().List(ctx)
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		cs, _ := c.Containers(nctx)
		for _, ctr := range cs {
			if task, err := ctr.Task(nctx, nil); err == nil {
				task.Kill(nctx, syscall.SIGKILL)
				task.Delete(nctx, client.WithProcessKill)
			}
			ctr.Delete(nctx, client.WithSnapshotCleanup)
		}
	}
}

// deleteRuncContainers force-deletes what the tests left in their runc roots.
func (h *harness) deleteRuncContainers(ctx context.Context) {
	roots, _ := os.ReadDir(h.runcRoots)
	for _, r := range roots {
		root := filepath.Join(h.runcRoots, r.Name())
		out, err := run(ctx, nil, h.runc, "--root", root, "list", "-q")
		if err != nil {
			continue
		}
		for _, id := range lines(out) {
			run(ctx, nil, h.runc, "--root", root, "delete", "--force", id)
		}
	}
}

// cleanupDir kills the shims of the containerd whose socket was in dir, and
// their containers, unmounts everything below dir and removes it.
func cleanupDir(dir string) {
	killShims(filepath.Join(dir, "ctd.sock"))
	unmountUnder(dir)
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "root e2e: remove %s: %v\n", dir, err)
	}
}

// sweepStale cleans up after earlier runs that were killed before their
// TestMain could (a panic, a test timeout): directories whose owner is gone.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join("/tmp", dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil {
			continue // malformed, or its run is still alive
		}
		if runc, err := exec.LookPath("runc"); err == nil {
			roots, _ := os.ReadDir(filepath.Join(dir, "runc"))
			for _, r := range roots {
				root := filepath.Join(dir, "runc", r.Name())
				out, _ := exec.Command(runc, "--root", root, "list", "-q").Output()
				for _, id := range lines(string(out)) {
					exec.Command(runc, "--root", root, "delete", "--force", id).Run()
				}
			}
		}
		fmt.Fprintf(os.Stderr, "root e2e: cleaning up %s, left by run %d\n", dir, pid)
		cleanupDir(dir)
	}
}

// killShims SIGKILLs the runc shims started by the containerd at addr, and
// their children (the containers' init processes; killing a pid
// namespace's init ends the rest of it).
func killShims(addr string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "containerd-shim") {
			continue
		}
		ours := false
		for i := 1; i < len(argv); i++ {
			if argv[i-1] == "-address" && argv[i] == addr {
				ours = true
			}
		}
		if !ours {
			continue
		}
		for _, child := range children(pid) {
			syscall.Kill(child, syscall.SIGKILL)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
