package mediator

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/isolation"
)

const restoreQuota = `
default_tenant = "shared"

[namespaces]
moby = "team-a"
other = "b"

[tenants.team-a]
memory = "64MiB"
max_containers = 3

[tenants.b]
bandwidth = "8MiB"

[tenants.shared]
`

// lockedBuffer is a log's output, read while the mediator may write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// host is a sim node, a quota file, and the container and state
// directories that mediators started one after another share, as one
// mediator restarted on one host does.
type host struct {
	t     testing.TB
	node  string
	sim   **accelerator.Node // the node at node, shared with siblings, which a test may restart
	dir   string
	quota string
	log   *lockedBuffer // every mediator's
	med   *Mediator     // the running one
}

func newHost(t testing.TB) *host { return newHostOf(t, 256<<20) }

// newHostOf is newHost with a device of mem bytes.
func newHostOf(t testing.TB, mem uint64) *host {
	t.Helper()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	n, addr, err := accelerator.StartSim("127.0.0.1:0", 1, mem, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tmp, err := os.MkdirTemp("", "vgpu") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	h := &host{t: t, node: addr.String(), sim: &n, dir: tmp, quota: filepath.Join(tmp, "q.toml"), log: &lockedBuffer{}}
	h.setQuota(restoreQuota)
	return h
}

func (h *host) setQuota(doc string) {
	h.t.Helper()
	if err := os.WriteFile(h.quota, []byte(doc), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) containerDir() string { return filepath.Join(h.dir, "c") }
func (h *host) stateDir() string     { return filepath.Join(h.dir, "state") }

// start starts a mediator on the host, the running one stopped first, and
// returns what it logged while it started.
func (h *host) start() string {
	h.t.Helper()
	return h.startWith(func(*Config) {})
}

// startWith is start with a configuration that set changes.
func (h *host) startWith(set func(*Config)) string {
	h.t.Helper()
	h.stop()
	before := len(h.log.String())
	log := logrus.New()
	log.SetOutput(h.log)
	cfg := Config{Nodes: []string{h.node}, Quota: h.quota, ContainerDir: h.containerDir(), StateDir: h.stateDir(),
		ReclaimInterval: 50 * time.Millisecond, Log: log}
	set(&cfg)
	m, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.med = m
	h.t.Cleanup(func() { m.Close() })
	return h.log.String()[before:]
}

func (h *host) stop() {
	if h.med != nil {
		h.med.Close()
		h.med = nil
	}
}

// sleeper starts a process standing for a container's init.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	p := exec.Command("sleep", "600")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Process.Kill()
		p.Wait()
	})
	return p
}

// end kills a container's process and reaps it: a zombie's pid still exists.
func end(p *exec.Cmd) {
	p.Process.Kill()
	p.Wait()
}

func (h *host) register(r api.Register) *api.RegisterReply {
	h.t.Helper()
	reply, err := h.med.Register(r)
	if err != nil {
		h.t.Fatal(err)
	}
	return reply
}

// tenant returns tenant name's line of the running mediator's tenants.
func (h *host) tenant(name string) isolation.TenantUse {
	h.t.Helper()
	for _, ti := range h.med.admission.Tenants() {
		if ti.Name == name {
			return ti
		}
	}
	h.t.Fatalf("tenant %s not listed", name)
	return isolation.TenantUse{}
}

// mallocThrough opens a session on socket and allocates n bytes.
func mallocThrough(socket string, n uint64) error {
	c, err := client.Dial(client.Options{Socket: socket})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Malloc(0, n)
	return err
}

// A restarted mediator has the registrations of the containers that still
// run — grants, reservations, sockets — and has dropped, from the store too,
// the one whose process ended meanwhile, removing its socket; a release
// after the restart is for good.
func TestRegistrationsSurviveARestart(t *testing.T) {
	h := newHost(t)
	h.start()
	live, doomed := sleeper(t), sleeper(t)
	runtimeDir := vocab.HostSocketDir(h.containerDir(), "moby", "live")
	if err := os.MkdirAll(runtimeDir, 0o755); err != nil { // the runtime's, before its hook registers
		t.Fatal(err)
	}
	liveSock := h.register(api.Register{Container: "live", Namespace: "moby", Memory: 16 << 20, Compute: 1, Pid: uint32(live.Process.Pid), SocketDir: runtimeDir}).Socket
	doomedSock := h.register(api.Register{Container: "doomed", Namespace: "moby", Memory: 8 << 20, Pid: uint32(doomed.Process.Pid)}).Socket
	h.register(api.Register{Container: "noproc", Memory: 4 << 20}) // tenant shared, no process to check
	if err := mallocThrough(liveSock, 16<<20); err != nil {
		t.Fatal(err)
	}
	before := h.tenant("shared")

	end(doomed)
	out := h.start()
	if ti := h.tenant("team-a"); ti.Containers != 1 || ti.Reserved != 16<<20 {
		t.Fatalf("team-a after the restart: %+v, want the live container's 16 MiB alone", ti)
	}
	if ti := h.tenant("shared"); ti != before {
		t.Fatalf("shared after the restart: %+v, want %+v as before", ti, before)
	}
	if !strings.Contains(out, "doomed") || !strings.Contains(out, "is gone") {
		t.Fatalf("the dropped registration was not logged with why:\n%s", out)
	}
	// The grant is what it was: all of it, and not a byte more.
	if err := mallocThrough(liveSock, 16<<20); err != nil {
		t.Fatalf("a session through the restored socket: %v", err)
	}
	if err := mallocThrough(liveSock, 16<<20+1); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("past the restored grant: %v, want quota exceeded", err)
	}
	if g, ok := h.med.admission.Lookup("moby", "live"); !ok || g.Compute != 1 || g.Devices != 1 {
		t.Fatalf("restored grant %+v, %v", g, ok)
	}
	if _, err := os.Lstat(filepath.Dir(doomedSock)); !os.IsNotExist(err) {
		t.Fatalf("the dropped container's socket directory, which the mediator made: %v, want it removed", err)
	}

	// Dropped from the store: the next start neither restores nor drops it.
	out = h.start()
	if strings.Contains(out, "doomed") || h.tenant("team-a").Containers != 1 {
		t.Fatalf("the dropped registration came back:\n%s", out)
	}
	// The vanished process is reclaimed as before a restart.
	end(live)
	waitFor(t, "the restored container to be reclaimed", func() bool { return h.tenant("team-a").Containers == 0 })
	if _, err := os.Lstat(liveSock); !os.IsNotExist(err) {
		t.Fatalf("the reclaimed container's socket: %v, want it removed", err)
	}
	if err := h.med.Release("", "noproc"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(vocab.HostSocketDir(h.containerDir(), "", "noproc")); !os.IsNotExist(err) {
		t.Fatalf("a restored container's socket directory, which the mediator made, after its release: %v, want it removed", err)
	}
	out = h.start()
	if ti := h.tenant("shared"); ti.Containers != 0 || strings.Contains(out, "restored") {
		t.Fatalf("released registrations came back: %+v\n%s", ti, out)
	}
}

// A registration is restored as a reload would keep it: over a cap lowered
// since (its tenant admits no more), and for a tenant removed since, under
// the limits it was admitted with.
func TestRestoreUnderAChangedQuota(t *testing.T) {
	h := newHost(t)
	h.start()
	p := sleeper(t)
	var sockets []string
	for _, id := range []string{"a1", "a2"} {
		sockets = append(sockets, h.register(api.Register{Container: id, Namespace: "moby", Memory: 16 << 20, Pid: uint32(p.Process.Pid)}).Socket)
	}
	bSock := h.register(api.Register{Container: "b1", Namespace: "other", Memory: 8 << 20, Pid: uint32(p.Process.Pid)}).Socket

	h.setQuota(`
[namespaces]
moby = "team-a"

[tenants.team-a]
memory = "16MiB"
max_containers = 1
`)
	out := h.start()
	if ti := h.tenant("team-a"); ti.Containers != 2 || ti.Reserved != 32<<20 || ti.Memory != 16<<20 {
		t.Fatalf("team-a over its new cap: %+v, want both containers restored", ti)
	}
	if !strings.Contains(out, "team-a") || !strings.Contains(out, "over its caps") {
		t.Fatalf("a tenant over its caps was not logged:\n%s", out)
	}
	if ti := h.tenant("b"); ti.Containers != 1 || ti.Reserved != 8<<20 || ti.Bandwidth != 8<<20 {
		t.Fatalf("removed tenant b: %+v, want its container and its last limits", ti)
	}
	if l := h.med.admission.Limits("b"); l == nil || l.Bandwidth != 8<<20 {
		t.Fatalf("removed tenant b's limits %+v: want those it was admitted with", l)
	}
	_, err := h.med.Register(api.Register{Container: "a3", Namespace: "moby", Memory: 1 << 20, Pid: uint32(p.Process.Pid)})
	if !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("a new container of a tenant over its cap: %v, want quota exceeded", err)
	}
	for _, s := range append(sockets, bSock) {
		if err := mallocThrough(s, 8<<20); err != nil {
			t.Fatalf("a session through %s: %v", s, err)
		}
	}
}

// plant writes registrations into the host's store, as a mediator killed
// before it released them left them.
func (h *host) plant(regs ...registration) {
	h.t.Helper()
	h.stop()
	s, _, err := openRegStore(h.stateDir())
	if err != nil {
		h.t.Fatal(err)
	}
	defer s.close()
	for _, r := range regs {
		if err := s.put(r); err != nil {
			h.t.Fatal(err)
		}
	}
}

// A registration that does not name a running container, or that cannot be
// restored whole, is dropped, saying why, and reserves nothing.
func TestRestoreDropsWhatItCannotRestore(t *testing.T) {
	h := newHost(t)
	h.start()
	self := processOf(os.Getpid())
	if self.start == 0 {
		t.Fatal("no start time for this process")
	}
	limits := &isolation.Tenant{Name: "team-a", Memory: 64 << 20, Compute: 1, Oversubscribe: 1, DedupCharge: 1}
	reg := func(id string, p process, byRuntime bool) registration {
		g := isolation.Grant{Namespace: "moby", Container: id, Tenant: "team-a", Memory: 1 << 20, Compute: 1, Devices: 1}
		return newRegistration(g, limits, p, h.med.boot, vocab.HostSocketDir(h.containerDir(), "moby", id), byRuntime)
	}
	good := reg("good", self, false)
	reused := reg("reused", process{self.pid, self.start + 1}, false)
	rebooted := reg("rebooted", self, false)
	rebooted.Boot = "an-earlier-boot"
	moved := reg("moved", self, false)
	moved.SocketDir = "/elsewhere/moby/moved"
	noDir := reg("nodir", self, true)
	badLimits := reg("badlimits", self, false)
	badLimits.Limits.Compute = 0
	h.plant(good, reused, rebooted, moved, noDir, badLimits)

	out := h.start()
	for id, why := range map[string]string{
		"reused":    "is another process now",
		"rebooted":  "before the host restarted",
		"moved":     "not where --container-dir",
		"nodir":     "is missing",
		"badlimits": "tenant compute 0",
	} {
		if !strings.Contains(out, "container="+id) || !strings.Contains(out, why) {
			t.Errorf("registration %s: want it dropped saying %q:\n%s", id, why, out)
		}
	}
	if ti := h.tenant("team-a"); ti.Containers != 1 || ti.Reserved != 1<<20 {
		t.Fatalf("team-a: %+v, want the good registration alone", ti)
	}
	if _, err := os.Lstat(filepath.Join(vocab.HostSocketDir(h.containerDir(), "moby", "good"), SocketName)); err != nil {
		t.Fatalf("the good registration's socket: %v", err)
	}
	out = h.start()
	if strings.Contains(out, "not restored") {
		t.Fatalf("dropped registrations were still in the store:\n%s", out)
	}
}

// A corrupt store is reported naming its file, kept aside, and the mediator
// starts with no registration, and records new ones.
func TestCorruptStoreStartsEmpty(t *testing.T) {
	h := newHost(t)
	h.start()
	h.register(api.Register{Container: "c", Namespace: "moby", Memory: 1 << 20, Pid: uint32(os.Getpid())})
	h.stop()
	path := filepath.Join(h.stateDir(), regFileName)
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xa5}, 16<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	out := h.start()
	if !strings.Contains(out, path) || !strings.Contains(out, "registration store unreadable") || !strings.Contains(out, path+".unreadable-") {
		t.Fatalf("the corrupt store was not reported with its file and where it went:\n%s", out)
	}
	if ti := h.tenant("team-a"); ti.Containers != 0 {
		t.Fatalf("restored from a corrupt store: %+v", ti)
	}
	h.register(api.Register{Container: "c", Namespace: "moby", Memory: 1 << 20, Pid: uint32(os.Getpid())})
	h.start()
	if ti := h.tenant("team-a"); ti.Containers != 1 {
		t.Fatalf("a registration made after the corrupt store was set aside: %+v, want it restored", ti)
	}
}

// A registration that cannot be recorded is refused, and holds nothing.
func TestUnrecordedRegistrationIsRefused(t *testing.T) {
	h := newHost(t)
	h.start()
	h.med.regs.db.Close() // as a failing disk would
	_, err := h.med.Register(api.Register{Container: "c", Namespace: "moby", Memory: 1 << 20, Pid: uint32(os.Getpid())})
	if !errors.Is(err, api.ErrInternal) || !strings.Contains(err.Error(), h.med.regs.path) {
		t.Fatalf("register with the store closed: %v, want an internal error naming the store", err)
	}
	if ti := h.tenant("team-a"); ti.Containers != 0 || ti.Reserved != 0 {
		t.Fatalf("a refused registration holds %+v", ti)
	}
	if _, err := os.Lstat(vocab.HostSocketDir(h.containerDir(), "moby", "c")); !os.IsNotExist(err) {
		t.Fatalf("a refused registration's socket directory: %v", err)
	}
}

// Without a state directory nothing is kept, and the mediator says so.
func TestNoStateDirKeepsNothing(t *testing.T) {
	h := newHost(t)
	log := logrus.New()
	log.SetOutput(h.log)
	for range 2 {
		m, err := New(Config{Nodes: []string{h.node}, Quota: h.quota, ContainerDir: h.containerDir(), Log: log})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(m.admission.Grants()); n != 0 {
			t.Fatalf("%d registrations restored without a state directory", n)
		}
		if _, err := m.Register(api.Register{Container: "c", Namespace: "moby", Memory: 1 << 20, Pid: uint32(os.Getpid())}); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if !strings.Contains(h.log.String(), "no state directory") {
		t.Fatalf("no word of registrations not being kept:\n%s", h.log)
	}
}

// A process is running while its pid names the process whose start time
// was read, not after it ended nor for a later process of the same pid.
func TestProcessRunning(t *testing.T) {
	self := processOf(os.Getpid())
	p := sleeper(t)
	child := processOf(p.Process.Pid)
	for _, tc := range []struct {
		name string
		p    process
		want bool
	}{
		{"this process", self, true},
		{"start time unknown", process{pid: os.Getpid()}, true},
		{"another start time", process{self.pid, self.start + 1}, false},
		{"no process", process{}, false},
		{"a child", child, true},
	} {
		if got := tc.p.running(); got != tc.want {
			t.Errorf("%s %+v: running %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
	end(p)
	if child.running() {
		t.Errorf("an ended child %+v is running", child)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
