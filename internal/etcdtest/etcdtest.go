// Package etcdtest starts real etcd clusters for tests: Debian's etcd
// (package etcd-server), one process per member, on a temporary directory
// and free loopback ports, stopped when the test ends. Members can be
// killed (SIGKILL) and started again, for fault tests.
//
// It runs the etcd binary rather than the embedded server module
// (go.etcd.io/etcd/server/v3/embed): a member is then a process that a
// test can SIGKILL like a crashed host, and the server's large dependency
// tree stays out of the module. Where no etcd binary is installed the test
// skips, or fails under VGPU_E2E_REQUIRE_ROOT=1 (internal/testenv).
package etcdtest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/testenv"
)

// Binary is the etcd executable the tests run: $VGPU_ETCD, else etcd on PATH.
func Binary() string {
	if b := os.Getenv("VGPU_ETCD"); b != "" {
		return b
	}
	b, _ := exec.LookPath("etcd")
	return b
}

// Cluster is a running etcd cluster of one or more members.
type Cluster struct {
	t       testing.TB
	bin     string
	dir     string
	members []*member
	tls     *tlsFiles // nil: plain http
}

type member struct {
	name, client, peer string // client and peer URLs
	dataDir, logFile   string

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd  // nil while stopped
}

// Start starts a cluster of n members and waits until it serves. Member
// timings are short (heartbeat 50ms, election 500ms), so that a new leader
// is elected well within a test's patience and short lease TTLs are kept.
func Start(t testing.TB, n int) *Cluster { return start(t, n, false) }

// StartTLS is Start with clients served https only, their certificates
// required (--client-cert-auth); TLSFiles names the client's PEM files.
func StartTLS(t testing.TB, n int) *Cluster { return start(t, n, true) }

func start(t testing.TB, n int, withTLS bool) *Cluster {
	t.Helper()
	bin := Binary()
	if bin == "" {
		testenv.Missing(t, "no etcd binary (apt-get install etcd-server, or set VGPU_ETCD)")
	}
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bin: bin, dir: dir}
	scheme := "http://"
	if withTLS {
		files, err := writeTLSFiles(dir)
		if err != nil {
			t.Fatal(err)
		}
		c.tls, scheme = files, "https://"
	}
	t.Cleanup(func() {
		for i := range c.members {
			c.Kill(i)
		}
		os.RemoveAll(dir)
	})
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i), client: scheme + freeAddr(t), peer: "http://" + freeAddr(t)}
		m.dataDir = filepath.Join(dir, m.name)
		m.logFile = filepath.Join(dir, m.name+".log")
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range c.members {
		c.start(m, strings.Join(initial, ","))
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *Cluster) start(m *member, initial string) {
	c.t.Helper()
	log, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	args := []string{"--name", m.name, "--data-dir", m.dataDir,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", filepath.Base(c.dir),
		"--heartbeat-interval", "50", "--election-timeout", "500"}
	if c.tls != nil {
		args = append(args, "--cert-file", c.tls.serverCert, "--key-file", c.tls.serverKey,
			"--trusted-ca-file", c.tls.ca, "--client-cert-auth")
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start etcd member %s: %v", m.name, err)
	}
	m.mu.Lock()
	m.cmd = cmd
	m.mu.Unlock()
}

// Endpoints are the client URLs of every member, started or not.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client
	}
	return out
}

// Endpoint is member i's client URL.
func (c *Cluster) Endpoint(i int) string { return c.members[i].client }

// Kill SIGKILLs member i and waits for it to exit; a stopped member is left so.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.cmd = nil
}

// Restart starts killed member i again on its data directory.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	var initial []string
	for _, m := range c.members {
		initial = append(initial, m.name+"="+m.peer)
	}
	c.start(c.members[i], strings.Join(initial, ","))
}

// WaitHealthy waits until every running member answers its health
// endpoint with a leader elected, failing the test after d.
func (c *Cluster) WaitHealthy(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		bad := ""
		for _, m := range c.members {
			m.mu.Lock()
			running := m.cmd != nil
			m.mu.Unlock()
			if running && !c.healthy(m.client) {
				bad = m.name
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcd member %s not healthy within %v; its log:\n%s", bad, d, c.Log(bad))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Log is the output of member name so far, for a failing test's message.
func (c *Cluster) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// healthy says whether the member at url reports itself healthy: a leader
// elected and a linearizable read served (etcd's /health).
func (c *Cluster) healthy(url string) bool {
	cl := http.Client{Timeout: time.Second}
	if c.tls != nil {
		cfg, err := c.tls.client()
		if err != nil {
			return false
		}
		cl.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	resp, err := cl.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var h struct{ Health string }
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
}

// CPU is the CPU time member i has used so far (user and system), read
// from /proc, for measuring the load a workload puts on etcd.
func (c *Cluster) CPU(i int) (time.Duration, error) {
	m := c.members[i]
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	if cmd == nil {
		return 0, fmt.Errorf("etcd member %s is not running", m.name)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which ends with the last ')':
	// utime and stime are the 12th and 13th of them, in clock ticks.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", cmd.Process.Pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100
