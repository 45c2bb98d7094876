package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/upgrade"
)

// upgradeTo runs vgpuctl upgrade (with --binary newBin unless "") and
// returns its report and error; a mediator that took over is stopped when
// the test ends, before the one the test started.
func (r *restartable) upgradeTo(newBin string, extra ...string) (upgrade.Report, string, error) {
	r.t.Helper()
	args := append([]string{"--socket", r.socket, "upgrade", "--json"}, extra...)
	if newBin != "" {
		args = append(args, "--binary", newBin)
	}
	out, err := run(r.t, "vgpuctl", args...)
	var rep upgrade.Report
	if i := strings.IndexByte(out, '{'); i >= 0 {
		if jerr := json.NewDecoder(strings.NewReader(out[i:])).Decode(&rep); jerr != nil {
			r.t.Fatalf("vgpuctl upgrade --json: %v\n%s", jerr, out)
		}
	}
	if rep.NewPid != 0 {
		r.t.Cleanup(func() { stopPid(r.t, rep.NewPid) })
	}
	return rep, out, err
}

// stopPid stops a mediator this test did not start (so cannot wait for):
// SIGTERM, then until it is gone or a zombie.
func stopPid(t *testing.T, pid int) {
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("mediator pid %d ignored SIGTERM for 10s", pid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone reports whether process pid has exited (a zombie has).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

// socketWatch checks a socket path over and over while an upgrade runs:
// that it exists, is a socket, and takes a connection.
type socketWatch struct {
	path   string
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	checks []time.Time // when each check began; guarded by mu
	bad    []string    // guarded by mu
}

func watchSocket(path string) *socketWatch {
	w := &socketWatch{path: path, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			at := time.Now()
			fi, err := os.Lstat(path)
			if err == nil && fi.Mode()&os.ModeSocket == 0 {
				err = fmt.Errorf("not a socket: %v", fi.Mode())
			}
			if err == nil {
				var c net.Conn
				// A connection waits in the backlog while no process
				// accepts: connect succeeds at once, or the socket is
				// unbound.
				if c, err = net.DialTimeout("unix", path, time.Second); err == nil {
					c.Close()
				}
			}
			w.mu.Lock()
			w.checks = append(w.checks, at)
			if err != nil {
				w.bad = append(w.bad, fmt.Sprintf("%s: %v", at.Format("15:04:05.000"), err))
			}
			w.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return w
}

// end stops the watch and fails the test if the socket was ever missing,
// unbound or refused, or if no check began during the upgrade, which ran
// from began to ended: a fast upgrade may see few checks, but a watch that
// saw none while it ran proves nothing.
func (w *socketWatch) end(t *testing.T, began, ended time.Time) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.bad) > 0 {
		t.Errorf("socket %s failed %d of %d checks during the upgrade, first: %s", w.path, len(w.bad), len(w.checks), w.bad[0])
	}
	during := 0
	for _, at := range w.checks {
		if !at.Before(began) && !at.After(ended) {
			during++
		}
	}
	if during == 0 {
		t.Errorf("socket %s: none of its %d checks began during the upgrade (%v)", w.path, len(w.checks), ended.Sub(began))
	}
}

// computing runs copies through its own session in a loop, each checked,
// until stopped; it counts the rounds that completed.
type computing struct {
	stop   chan struct{}
	done   chan error
	rounds atomic.Int64
	took   []time.Duration // each round's time; read once done
}

func compute(c *client.Client) *computing {
	k := &computing{stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		const n = 256 << 10
		p, err := c.Malloc(0, n)
		if err != nil {
			k.done <- err
			return
		}
		s := c.Stream()
		want, got := make([]byte, n), make([]byte, n)
		for i := 0; ; i++ {
			began := time.Now()
			select {
			case <-k.stop:
				k.done <- nil
				return
			default:
			}
			for j := range want {
				want[j] = byte(rand.Uint32())
			}
			s.CopyToDevice(p, want)
			s.CopyFromDevice(got, p)
			if err := s.Synchronize(); err != nil {
				k.done <- fmt.Errorf("round %d: %w", i, err)
				return
			}
			if !bytes.Equal(got, want) {
				k.done <- fmt.Errorf("round %d: read back differs from what was written", i)
				return
			}
			k.took = append(k.took, time.Since(began))
			k.rounds.Add(1)
		}
	}()
	return k
}

// buildMediator builds vgpu-mediator afresh, to a new file.
func buildMediator(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vgpu-mediator-new")
	out, err := exec.Command("go", "build", "-o", path, "github.com/vgpu/vgpu/cmd/vgpu-mediator").CombinedOutput()
	if err != nil {
		t.Fatalf("building the new vgpu-mediator: %v\n%s", err, out)
	}
	return path
}

// TestLiveUpgrade: vgpuctl upgrade to a freshly built binary, while a
// tenant computes and two more hold data on the device, one of them
// through a container's socket. The new process (another pid, running
// the new file) serves; the host socket and the container's socket exist
// and take connections at every moment of the upgrade; the computing
// tenant goes on, and every byte of the others reads back intact.
func TestLiveUpgrade(t *testing.T) {
	newBin := buildMediator(t)
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	p := sleeping(t)
	ctrSock := r.register(api.Register{Container: "job", Namespace: "moby", Memory: 32 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	host := r.dial(0)
	hostWs := writeBuffers(t, host, 6<<20, 3000)
	ctr, err := client.Dial(client.Options{Socket: ctrSock})
	if err != nil {
		t.Fatal(err)
	}
	defer ctr.Close()
	ctrWs := writeBuffers(t, ctr, 8<<20, 777)
	busy := compute(r.dial(0))
	waitFor(t, "the computing tenant's first rounds", func() bool { return busy.rounds.Load() > 3 })

	watches := []*socketWatch{watchSocket(r.socket), watchSocket(ctrSock)}
	time.Sleep(20 * time.Millisecond) // some checks before, so the watch spans the upgrade
	began := time.Now()
	rep, out, err := r.upgradeTo(newBin)
	upgradeTook := time.Since(began)
	time.Sleep(20 * time.Millisecond)
	for _, w := range watches {
		w.end(t, began, began.Add(upgradeTook))
	}
	if err != nil {
		t.Fatalf("vgpuctl upgrade: %v\n%s\nmediator log:\n%s", err, out, r.med.out)
	}
	if rep.OldPid != oldPid || rep.NewPid == 0 || rep.NewPid == oldPid || rep.Binary != newBin {
		t.Fatalf("upgrade report %+v: want old pid %d, another new pid, binary %s", rep, oldPid, newBin)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", rep.NewPid)); err != nil || exe != newBin {
		t.Fatalf("pid %d runs %q (%v), want the new build %s", rep.NewPid, exe, err, newBin)
	}
	waitFor(t, "the old mediator to exit", func() bool { return gone(oldPid) })

	before := busy.rounds.Load()
	waitFor(t, "the computing tenant's rounds after the upgrade", func() bool { return busy.rounds.Load() > before+3 })
	// The computing tenant has resumed its session with the successor.
	r.med.out.waitLog(t, "the log does not show the handover and a resumed session", "upgrade: the successor serves", "session resumed")
	close(busy.stop)
	if err := <-busy.done; err != nil {
		t.Fatalf("the computing tenant: %v\nmediator log:\n%s", err, r.med.out)
	}
	typical := slices.Sorted(slices.Values(busy.took))[len(busy.took)/2]
	t.Logf("vgpuctl upgrade took %v; the computing tenant's longest round %v, %.0f× its median round %v (%d rounds)",
		upgradeTook, slices.Max(busy.took), float64(slices.Max(busy.took))/float64(typical), typical, len(busy.took))
	checkBuffers(t, host, hostWs, "on the host socket after the upgrade")
	checkBuffers(t, ctr, ctrWs, "through the container's socket after the upgrade")
	if err := computeThrough(t, ctrSock); err != nil {
		t.Fatalf("a new program through the container's socket after the upgrade: %v", err)
	}
}

// TestLiveUpgradeBrokenBinary: a new binary that exits at once leaves the
// running mediator serving, untouched, and vgpuctl upgrade fails quoting
// what the binary said. One that fails after it took over (here: its
// status page's port is taken) is replaced by the previous binary, which
// restores every session as the new one would have.
func TestLiveUpgradeBrokenBinary(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	c := r.dial(0)
	ws := writeBuffers(t, c, 4<<20, 5000)

	broken := filepath.Join(t.TempDir(), "broken")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'vgpu-mediator: this build is broken' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	rep, out, err := r.upgradeTo(broken)
	if err == nil || !strings.Contains(out, "this build is broken") || !strings.Contains(out, "exit status 1") || rep.NewPid != 0 {
		t.Fatalf("vgpuctl upgrade to a binary that exits 1: %v, report %+v\n%s", err, rep, out)
	}
	if gone(oldPid) || strings.Contains(r.med.out.String(), "handing over") {
		t.Fatalf("the mediator did not serve on after a failed start:\n%s", r.med.out)
	}
	checkBuffers(t, c, ws, "after an upgrade to a broken binary")

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failsLate := filepath.Join(t.TempDir(), "fails-late")
	script := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\" --http %s\n", filepath.Join(bin, "vgpu-mediator"), taken.Addr())
	if err := os.WriteFile(failsLate, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rep, out, err = r.upgradeTo(failsLate)
	if err == nil || !rep.RolledBack || rep.NewPid == 0 || rep.NewPid == oldPid || !strings.Contains(out, "--http") {
		t.Fatalf("vgpuctl upgrade to a binary that fails while restoring: %v, report %+v, want a roll back\n%s\nmediator log:\n%s", err, rep, out, r.med.out)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", rep.NewPid)); err != nil || exe != filepath.Join(bin, "vgpu-mediator") {
		t.Fatalf("pid %d runs %q (%v) after the roll back, want the previous binary", rep.NewPid, exe, err)
	}
	checkBuffers(t, c, ws, "after the roll back")
}
