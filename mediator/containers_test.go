package mediator_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/testenv"
	"github.com/vgpu/vgpu/mediator"
)

const quotaFile = `
default_tenant = "shared"

[namespaces]
moby = "team-a"

[tenants.team-a]
memory = "64MiB"
max_containers = 2
default_memory = "16MiB"

[tenants.shared]
`

// containerSystem is a mediator with a quota file and a container directory.
type containerSystem struct {
	*system
	dir   string
	quota string
}

func startContainers(t *testing.T, edits ...func(*mediator.Config)) *containerSystem {
	t.Helper()
	quota := filepath.Join(t.TempDir(), "q.toml")
	if err := os.WriteFile(quota, []byte(quotaFile), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startWith(t, 256<<20, func(c *mediator.Config) {
		c.Quota, c.ReclaimInterval = quota, 50*time.Millisecond
		for _, edit := range edits {
			edit(c)
		}
	})
	return &containerSystem{system: s, dir: filepath.Join(s.dir, "c"), quota: quota}
}

func (cs *containerSystem) operator(t *testing.T) *client.Operator {
	t.Helper()
	op, err := client.DialOperator(cs.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	return op
}

func tenantInfo(t *testing.T, op *client.Operator, name string) api.TenantInfo {
	t.Helper()
	ts, err := op.Tenants()
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range ts {
		if ti.Name == name {
			return ti
		}
	}
	t.Fatalf("tenant %s not listed in %+v", name, ts)
	return api.TenantInfo{}
}

func TestContainerLifecycle(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	reply, err := op.Register(api.Register{Container: "c1", Namespace: "moby", Memory: 32 << 20, Pid: uint32(os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Tenant != "team-a" || reply.Memory != 32<<20 || reply.Socket != filepath.Join(cs.dir, "moby", "c1", mediator.SocketName) {
		t.Fatalf("register reply %+v", reply)
	}
	// The container's tenant is the operator's decision; a claim is refused.
	if _, err := client.Dial(client.Options{Socket: reply.Socket, Tenant: "shared"}); err == nil {
		t.Fatal("a container claimed another tenant and was served")
	} else {
		wantErr(t, err, api.ErrPermissionDenied, "team-a", "shared")
	}
	c, err := client.Dial(client.Options{Socket: reply.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Its virtual device has the memory of its grant, not the device's 256 MiB.
	if m := c.Devices()[0].Memory; m != 32<<20 {
		t.Fatalf("the container's device reports %d bytes, want its grant of %d", m, 32<<20)
	}
	// The grant is exact: all of it can be allocated, one byte more cannot.
	if _, err := c.Malloc(0, 32<<20); err != nil {
		t.Fatalf("allocate the whole grant: %v", err)
	}
	_, err = c.Malloc(0, 1)
	wantErr(t, err, api.ErrQuotaExceeded, "c1", "team-a")
	bystander := cs.dial(t, "bystander", 1)
	victim(t, bystander) // host sessions are unaffected
	if m := bystander.Devices()[0].Memory; m != 256<<20 {
		t.Fatalf("an uncapped host session's device reports %d bytes, want the device's %d", m, 256<<20)
	}

	ti := tenantInfo(t, op, "team-a")
	if ti.Containers != 1 || ti.Reserved != 32<<20 || ti.Allocated != 32<<20 || ti.Memory != 64<<20 {
		t.Fatalf("tenant team-a: %+v", ti)
	}
	inC1 := 0
	for _, ts := range cs.med.Status().Tenants {
		if ts.Container == "c1" && ts.Namespace == "moby" && ts.Tenant == "team-a" {
			inC1++
		}
	}
	if inC1 != 1 {
		t.Fatalf("status shows %d sessions of container c1, want 1", inC1)
	}
	// Status shows the container's reservation, beside its sessions.
	if got := cs.med.Status().Containers; len(got) != 1 || got[0].Namespace != "moby" || got[0].Container != "c1" ||
		got[0].Tenant != "team-a" || got[0].Memory != 32<<20 {
		t.Fatalf("status containers %+v, want c1 of moby with 32 MiB reserved for team-a", got)
	}
	// Release ends the sessions and frees everything.
	bystander.Close()
	wantErr(t, op.Release("", "c1"), api.ErrInvalidArgument, `"c1" of namespace ""`) // the id alone names none
	if err := op.Release("moby", "c1"); err != nil {
		t.Fatal(err)
	}
	// Release returns once the container's sessions have freed their memory.
	if ti := tenantInfo(t, op, "team-a"); ti.Allocated != 0 {
		t.Fatalf("right after release team-a still holds %d bytes", ti.Allocated)
	}
	cs.waitIdle(t)
	if _, err := os.Stat(reply.Socket); !os.IsNotExist(err) {
		t.Fatalf("socket still there after release: %v", err)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Containers != 0 || ti.Reserved != 0 {
		t.Fatalf("after release: %+v", ti)
	}
	if got := cs.med.Status().Containers; len(got) != 0 {
		t.Fatalf("status containers after release: %+v", got)
	}
	wantErr(t, op.Release("moby", "c1"), api.ErrInvalidArgument, "c1")
}

func TestAdmission(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	_, err := op.Register(api.Register{Container: "big", Namespace: "moby", Memory: 64<<20 + 1})
	wantErr(t, err, api.ErrQuotaExceeded, "team-a")
	if _, err := op.Register(api.Register{Container: "a", Namespace: "moby", Memory: 48 << 20}); err != nil {
		t.Fatal(err)
	}
	r, err := op.Register(api.Register{Container: "b", Namespace: "moby"}) // the default request
	if err != nil || r.Memory != 16<<20 {
		t.Fatalf("default request: %+v, %v", r, err)
	}
	_, err = op.Register(api.Register{Container: "c", Namespace: "moby", Memory: 4096})
	wantErr(t, err, api.ErrQuotaExceeded) // max_containers = 2, and the cap is reached
	_, err = op.Register(api.Register{Container: "a", Namespace: "moby", Memory: 4096})
	wantErr(t, err, api.ErrInvalidArgument, "a")
	// Namespaces without a mapping go to the default tenant; the runtime's
	// tenant wins over the namespace; unknown tenants are refused.
	if r, err := op.Register(api.Register{Container: "d", Namespace: "k8s.io", Memory: 1 << 20}); err != nil || r.Tenant != "shared" {
		t.Fatalf("default tenant: %+v, %v", r, err)
	}
	if r, err := op.Register(api.Register{Container: "e", Namespace: "moby", Tenant: "shared", Memory: 1 << 20}); err != nil || r.Tenant != "shared" {
		t.Fatalf("runtime tenant: %+v, %v", r, err)
	}
	_, err = op.Register(api.Register{Container: "f", Tenant: "nobody", Memory: 1 << 20})
	wantErr(t, err, api.ErrPermissionDenied, "nobody")
	// Bad ids and namespaces, and socket directories other than the
	// container's.
	_, err = op.Register(api.Register{Container: "../x", Memory: 1 << 20})
	wantErr(t, err, api.ErrInvalidArgument, "../x")
	for _, ns := range []string{"..", ".", "a/b", "_", "-x", strings.Repeat("n", 129)} {
		_, err = op.Register(api.Register{Container: "h", Namespace: ns, Memory: 1 << 20})
		wantErr(t, err, api.ErrInvalidArgument, fmt.Sprintf("namespace %q", ns))
	}
	_, err = op.Register(api.Register{Container: "h", Namespace: "moby", Memory: 1 << 20, SocketDir: filepath.Join(cs.dir, "h")})
	wantErr(t, err, api.ErrInvalidArgument, filepath.Join(cs.dir, "moby", "h"))
	_, err = op.Register(api.Register{Container: "g", Memory: 1 << 20, SocketDir: "/etc"})
	wantErr(t, err, api.ErrInvalidArgument, "/etc")
}

func TestVanishedContainerIsReclaimed(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	proc := exec.Command("sleep", "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := op.Register(api.Register{Container: "doomed", Namespace: "moby", Memory: 8 << 20, Pid: uint32(proc.Process.Pid)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(client.Options{Socket: r.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 8<<20); err != nil {
		t.Fatal(err)
	}
	proc.Process.Kill()
	proc.Wait()
	cs.waitIdle(t)
	// The release drops the container's sessions before it returns the
	// grant, so an idle system may still show the reservation a moment.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ti := tenantInfo(t, op, "team-a")
		if ti.Containers == 0 && ti.Reserved == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after the process vanished: %+v", ti)
		}
	}
}

func TestQuotaReload(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	if err := os.WriteFile(cs.quota, []byte("[tenants.team-a]\nmemory = \"12X\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantErr(t, op.Reload(), api.ErrInvalidArgument, "q.toml:2", "12X")
	if ti := tenantInfo(t, op, "team-a"); ti.Memory != 64<<20 {
		t.Fatalf("an invalid file replaced the quotas: %+v", ti)
	}
	if err := os.WriteFile(cs.quota, []byte("default_tenant = \"team-a\"\n[tenants.team-a]\nmemory = \"1GiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := op.Reload(); err != nil {
		t.Fatal(err)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Memory != 1<<30 {
		t.Fatalf("after reload: %+v", ti)
	}
}

// A registration that races a reload is resolved and admitted under one
// quota file. Each file refuses 32MiB to namespace moby, whose tenant has a
// cap of 16MiB in both; but the first maps moby to team-a, and the second
// gives team-a 1GiB: moby's tenant under the first with the limits of the
// second would admit it.
func TestRegisterAcrossReloads(t *testing.T) {
	cs := startContainers(t)
	files := []string{
		"[namespaces]\nmoby = \"team-a\"\n[tenants.team-a]\nmemory = \"16MiB\"\n[tenants.shared]\nmemory = \"16MiB\"\n",
		"[namespaces]\nmoby = \"shared\"\n[tenants.team-a]\nmemory = \"1GiB\"\n[tenants.shared]\nmemory = \"16MiB\"\n",
	}
	// Each file replaces the last whole, so a reload never reads half of one.
	write := func(i int) {
		tmp := cs.quota + ".new"
		if err := os.WriteFile(tmp, []byte(files[i%2]), 0o644); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tmp, cs.quota); err != nil {
			t.Error(err)
		}
	}
	write(0)
	if err := cs.med.Reload(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var reloads sync.WaitGroup
	var reloaded atomic.Int64 // reloads done
	reloads.Add(1)
	go func() {
		defer reloads.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			write(i)
			if err := cs.med.Reload(); err != nil {
				t.Errorf("reload: %v", err)
				return
			}
			reloaded.Add(1)
		}
	}()
	// The race needs reloads that switch the file while registrations run:
	// counted from the first registration's start to the last one's end.
	first := reloaded.Load()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				r, err := cs.med.Register(api.Register{Container: fmt.Sprintf("w%d-%d", w, i), Namespace: "moby", Memory: 32 << 20})
				if !errors.Is(err, api.ErrQuotaExceeded) {
					t.Errorf("registration of 32MiB: %+v, %v; want it refused under either file", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	during := reloaded.Load() - first
	close(stop)
	reloads.Wait()
	t.Logf("%d reloads while 4000 registrations ran", during)
	if during < 2 {
		t.Errorf("the race never happened: %d reloads while the registrations ran, want at least 2 (one each way)", during)
	}
}

// A containerd report that a container ended arrives late: it must not
// release a registration of that container whose process still runs (the id
// registered again by a restarted container), nor one of another namespace,
// and releases one whose process is gone.
func TestContainerGoneSparesALiveRegistration(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	if _, err := op.Register(api.Register{Container: "again", Namespace: "moby", Memory: 8 << 20, Pid: uint32(os.Getpid())}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, cs.med.ContainerGone("moby", "again", 0), api.ErrInvalidArgument, "still running")
	wantErr(t, cs.med.ContainerGone("moby", "again", uint32(os.Getpid())+1), api.ErrInvalidArgument, "still running")
	wantErr(t, cs.med.ContainerGone("k8s.io", "again", 0), api.ErrInvalidArgument, "not registered")
	if ti := tenantInfo(t, op, "team-a"); ti.Containers != 1 || ti.Reserved != 8<<20 {
		t.Fatalf("a report of a live container's end released it: %+v", ti)
	}
	proc := exec.Command("true")
	if err := proc.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Register(api.Register{Container: "ended", Namespace: "moby", Memory: 8 << 20, Pid: uint32(proc.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	// The reclaim loop may have released it first: either way it goes.
	if err := cs.med.ContainerGone("moby", "ended", 0); err != nil && !strings.Contains(err.Error(), "not registered") {
		t.Fatal(err)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Containers != 1 || ti.Reserved != 8<<20 {
		t.Fatalf("after the ended container's report: %+v", ti)
	}
	wantErr(t, cs.med.ContainerGone("moby", "ended", 0), api.ErrInvalidArgument, "not registered")

	// A report that names the registered pid releases it even though a
	// process of that pid runs: the pid was taken again since the exit.
	if err := cs.med.ContainerGone("moby", "again", uint32(os.Getpid())); err != nil {
		t.Fatalf("a report naming the registered pid: %v", err)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Containers != 0 || ti.Reserved != 0 {
		t.Fatalf("after a report naming the registered pid: %+v", ti)
	}
}

// A reload that finds the quota file missing (deleted by mistake, or caught
// while being replaced) keeps the current quotas: falling back to the
// built-in default would map every namespace to one tenant without caps.
// Of two reloads at once, the later file is the one left in force: each
// reads and installs its file in one step.
func TestConcurrentReloadsKeepTheLatestFile(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	for i := range 400 {
		done := make(chan error, 1)
		go func() { done <- cs.med.Reload() }()
		body := fmt.Sprintf("[tenants.team-a]\nmemory = \"%dMiB\"\n", i+1)
		tmp := cs.quota + ".new"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cs.quota); err != nil {
			t.Fatal(err)
		}
		if err := cs.med.Reload(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if ti := tenantInfo(t, op, "team-a"); ti.Memory != uint64(i+1)<<20 {
			t.Fatalf("round %d: after both reloads team-a has %d bytes, the latest file says %d", i, ti.Memory, uint64(i+1)<<20)
		}
	}
}

// A tenant that a reload removes while it holds a container is listed with
// the limits it had until the container goes.
func TestRemovedTenantListedWithItsLimits(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	if _, err := op.Register(api.Register{Container: "c1", Namespace: "moby", Memory: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cs.quota, []byte("[tenants.shared]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := op.Reload(); err != nil {
		t.Fatal(err)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Memory != 64<<20 || ti.MaxContainers != 2 || ti.Containers != 1 {
		t.Fatalf("team-a removed with a container running: %+v", ti)
	}
	if err := op.Release("moby", "c1"); err != nil {
		t.Fatal(err)
	}
	ts, err := op.Tenants()
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range ts {
		if ti.Name == "team-a" {
			t.Fatalf("team-a listed after its last container went: %+v", ti)
		}
	}
}

func TestQuotaReloadOfMissingFileKeepsQuotas(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	if err := os.Remove(cs.quota); err != nil {
		t.Fatal(err)
	}
	wantErr(t, op.Reload(), api.ErrUnavailable, "q.toml")
	if ti := tenantInfo(t, op, "team-a"); ti.Memory != 64<<20 {
		t.Fatalf("a missing file replaced the quotas: %+v", ti)
	}
	_, err := op.Register(api.Register{Container: "big", Namespace: "moby", Memory: 64<<20 + 1})
	wantErr(t, err, api.ErrQuotaExceeded, "team-a")
}

// A process outside the container's pid namespace that gets hold of the
// container's socket is refused.
func TestContainerSocketRefusesOutsiders(t *testing.T) {
	testenv.NeedRoot(t, "needs root to make a pid namespace")
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Missing(t, "unshare not installed (util-linux)")
	}
	cs := startContainers(t)
	op := cs.operator(t)
	// The container's init: a process in a pid namespace of its own.
	init := exec.Command(unshare, "--pid", "--fork", "--kill-child", "sleep", "60")
	if err := init.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { init.Process.Kill(); init.Wait() }()
	var child int
	deadline := time.Now().Add(5 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", init.Process.Pid, init.Process.Pid))
		fmt.Sscan(string(b), &child)
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("the namespaced child did not start")
	}
	r, err := op.Register(api.Register{Container: "ns", Namespace: "moby", Memory: 1 << 20, Pid: uint32(child)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Dial(client.Options{Socket: r.Socket})
	wantErr(t, err, api.ErrPermissionDenied, "not in the container")
}

// Containers are named by namespace and id: one id in two namespaces is two
// containers, with their own sockets, tenants and grants, released each on
// its own.
func TestOneIDInTwoNamespaces(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	// A 64-character id, as Docker's and the CRI's are, in a long namespace:
	// the socket's path is longer than a socket address holds.
	id := strings.Repeat("f00d", 16)
	long := "a-rather-long-containerd-namespace.example"
	regs := []struct {
		ns, tenant string
		memory     uint64
	}{{"moby", "team-a", 8 << 20}, {"k8s.io", "shared", 4 << 20}, {long, "shared", 2 << 20}, {"", "shared", 1 << 20}}
	sockets := map[string]string{}
	clients := map[string]*client.Client{}
	for _, r := range regs {
		reply, err := op.Register(api.Register{Container: id, Namespace: r.ns, Memory: r.memory, Pid: uint32(os.Getpid())})
		if err != nil {
			t.Fatalf("namespace %q: %v", r.ns, err)
		}
		if want := filepath.Join(vocab.HostSocketDir(cs.dir, r.ns, id), mediator.SocketName); reply.Socket != want || reply.Tenant != r.tenant {
			t.Fatalf("namespace %q: reply %+v, want socket %s, tenant %s", r.ns, reply, want, r.tenant)
		}
		sockets[r.ns] = reply.Socket
		// Dialled through its directory, as a path this long cannot be.
		d, err := os.Open(filepath.Dir(reply.Socket))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		c, err := client.Dial(client.Options{Socket: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), mediator.SocketName)})
		if err != nil {
			t.Fatalf("namespace %q: dial %s: %v", r.ns, reply.Socket, err)
		}
		defer c.Close()
		if _, err := c.Malloc(0, r.memory); err != nil {
			t.Fatalf("namespace %q: allocate the grant: %v", r.ns, err)
		}
		clients[r.ns] = c
	}
	if len(sockets[long]) <= 108 {
		t.Fatalf("socket path %s is short enough for a socket address; the test wants a longer one", sockets[long])
	}
	_, err := op.Register(api.Register{Container: id, Namespace: "moby", Memory: 1 << 20})
	wantErr(t, err, api.ErrInvalidArgument, id, `namespace "moby"`)
	seen := map[string]bool{}
	for _, ts := range cs.med.Status().Tenants {
		if ts.Container == id {
			seen[ts.Namespace+"|"+ts.Tenant] = true
		}
	}
	if want := map[string]bool{"moby|team-a": true, "k8s.io|shared": true, long + "|shared": true, "|shared": true}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("status shows sessions %v, want %v", seen, want)
	}
	want := func(tenant string, containers int, reserved uint64) {
		t.Helper()
		if ti := tenantInfo(t, op, tenant); ti.Containers != containers || ti.Reserved != reserved || ti.Allocated != reserved {
			t.Fatalf("tenant %s: %+v; want %d containers, %d bytes reserved and allocated", tenant, ti, containers, reserved)
		}
	}
	want("team-a", 1, 8<<20)
	want("shared", 3, 7<<20)

	// Releasing moby's leaves the others serving.
	if err := op.Release("moby", id); err != nil {
		t.Fatal(err)
	}
	want("team-a", 0, 0)
	want("shared", 3, 7<<20)
	if _, err := os.Stat(sockets["moby"]); !os.IsNotExist(err) {
		t.Fatalf("moby's socket still there: %v", err)
	}
	for _, ns := range []string{"k8s.io", long, ""} {
		if _, err := os.Stat(sockets[ns]); err != nil {
			t.Fatalf("namespace %q lost its socket with moby's: %v", ns, err)
		}
		if _, err := clients[ns].Malloc(0, 1); !errors.Is(err, api.ErrQuotaExceeded) {
			t.Fatalf("namespace %q: session after moby's release: %v", ns, err)
		}
	}
	// The reclaim of vanished containers and containerd's reports name the
	// namespace too.
	wantErr(t, cs.med.ContainerGone("moby", id, 0), api.ErrInvalidArgument, "not registered")
	wantErr(t, cs.med.ContainerGone("k8s.io", id, 0), api.ErrInvalidArgument, "still running")
	for i, ns := range []string{"k8s.io", long, ""} {
		if err := op.Release(ns, id); err != nil {
			t.Fatalf("namespace %q: %v", ns, err)
		}
		if _, err := os.Stat(sockets[ns]); !os.IsNotExist(err) {
			t.Fatalf("namespace %q: socket still there: %v", ns, err)
		}
		if _, err := os.Stat(filepath.Dir(sockets[ns])); !os.IsNotExist(err) {
			t.Fatalf("namespace %q: socket directory still there: %v", ns, err)
		}
		if i < 2 {
			if _, err := os.Stat(sockets[""]); err != nil {
				t.Fatalf("the container without a namespace lost its socket: %v", err)
			}
		}
	}
	want("shared", 0, 0)
	cs.waitIdle(t)
}
