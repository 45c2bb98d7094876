package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/mediator"
)

// Attacks of local users on the mediator's host socket, each beside a victim
// whose results are checked, with the mediator under an address-space limit
// and its peak resident memory bounded.

const (
	// attackedAS is the mediator's address-space limit (prlimit --as)
	// during an attack: the flood of stalled hellos needed 7 GB before the
	// bound on them, and 3 000 stalled hellos killed a mediator under 4 GiB.
	attackedAS = 2 << 30
	// attackedPeakRSS is the most resident memory the mediator may reach
	// during an attack, its start included.
	attackedPeakRSS = 256 << 20
	// Unprivileged users: the mediator treats root and its own user as
	// operators, never counted or refused as others are.
	attackerUID = 65534
	victimUID   = 65533
)

// attackedMediator starts a node and a mediator whose socket other users
// can reach (hostDir), and puts the mediator under attackedAS.
func attackedMediator(t *testing.T) (socket string, med *proc) {
	t.Helper()
	dir := hostDir(t)
	addr := startNode(t, "--devices", "1", "--memory", "1GiB")
	socket = filepath.Join(dir, "mediator.sock")
	med = startProc(t, "vgpu-mediator", "--socket", socket, "--node", addr, "--state-dir", dir,
		"--quota", "", "--containerd", "", "--log-level", "warn")
	lim := unix.Rlimit{Cur: attackedAS, Max: attackedAS}
	if err := unix.Prlimit(med.cmd.Process.Pid, unix.RLIMIT_AS, &lim, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "vgpu-mediator to serve on its socket", func() bool { return daemon.Serving(socket) })
	return socket, med
}

// victim runs the tenant program as victimUID and checks its results.
func victim(t *testing.T, socket, tenant string) {
	t.Helper()
	out, code := runCred(t, as(victimUID, victimUID), "tenant", "--socket", socket, "--tenant", tenant, "--n", "300000")
	if code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("victim: exit %d\n%s", code, out)
	}
}

// memoryKiB reads a field (VmRSS, VmHWM) of /proc/pid/status.
func memoryKiB(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// checkSurvived checks that the mediator still runs, has stayed under
// attackedPeakRSS, and serves the victim.
func checkSurvived(t *testing.T, socket string, med *proc) {
	t.Helper()
	if err := med.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the mediator died: %v\n%s", err, med.out)
	}
	peak := memoryKiB(t, med.cmd.Process.Pid, "VmHWM") << 10
	t.Logf("mediator's peak resident memory: %d MiB (bound %d MiB, address space %d MiB)", peak>>20, attackedPeakRSS>>20, attackedAS>>20)
	if peak > attackedPeakRSS {
		t.Errorf("mediator's peak resident memory %d MiB, more than %d MiB", peak>>20, attackedPeakRSS>>20)
	}
	victim(t, socket, "victim")
}

// stalled is the hostile program's report of a flood of stalled hellos.
type stalled struct{ Opened, Failed, Refused, Errors, Held, Other int }

// stallHellos runs the hostile program as attackerUID: conns connections
// whose hello header announces a body of announce bytes, then nothing. It
// returns the program's report once the mediator has dealt with them; the
// program holds what stays open until the test ends.
func stallHellos(t *testing.T, socket string, conns int, announce uint32, operator bool) stalled {
	t.Helper()
	flood := exec.Command(filepath.Join(bin, "hostile"), "stall-hellos", "--socket", socket,
		"--conns", strconv.Itoa(conns), "--len", strconv.Itoa(int(announce)), "--operator="+strconv.FormatBool(operator))
	flood.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: attackerUID, Gid: attackerUID}}
	hold, err := flood.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := flood.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	flood.Stderr = &stderr
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Close(); flood.Wait() })
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("flooder: %v\n%s", err, stderr.String())
	}
	var st stalled
	if err := json.Unmarshal(line, &st); err != nil {
		t.Fatalf("flooder's report %q: %v", line, err)
	}
	t.Logf("%d connections announcing %d bytes (operator %v): %+v", conns, announce, operator, st)
	return st
}

// An unprivileged user opens 4 000 connections that each announce a hello
// of wire.MaxBody bytes and stall: before hellos were bounded, each cost the
// mediator a MaxBody buffer, and such a flood killed it. Every one is now
// refused at once. Then 4 000 that announce a hello of a hello's size and
// stall: the mediator holds at most MaxHandshakesPerUID of them and closes
// the rest at once. It stays small and serves a victim of another uid.
func TestStalledHelloFlood(t *testing.T) {
	socket, med := attackedMediator(t)
	victim(t, socket, "victim")

	const conns = 4000
	big := stallHellos(t, socket, conns, wire.MaxBody, false)
	if big.Held != 0 || big.Other != 0 || big.Refused+big.Errors+big.Failed != conns {
		t.Errorf("the mediator still holds %d hellos announcing %d bytes, or answered %d with no error", big.Held, wire.MaxBody, big.Other)
	}
	small := stallHellos(t, socket, conns, api.MaxHelloBody, false)
	// While the flooder holds what it could: the victim is served.
	checkSurvived(t, socket, med)
	if small.Held < 1 || small.Held > mediator.MaxHandshakesPerUID {
		t.Errorf("the mediator holds %d of the flooder's stalled hellos, want 1 to %d", small.Held, mediator.MaxHandshakesPerUID)
	}
	if small.Refused+small.Failed < conns-mediator.MaxHandshakesPerUID || small.Other+small.Errors != 0 {
		t.Errorf("of %d stalled hellos %d were refused and %d failed to connect, want all but %d; %d answered", conns, small.Refused, small.Failed, mediator.MaxHandshakesPerUID, small.Other+small.Errors)
	}
	if !strings.Contains(med.out.String(), "refusing connections that have not said hello") {
		t.Errorf("the mediator logged no refusal:\n%s", med.out)
	}
}

// The same user completes operator hellos, which anyone may, and then
// stalls a status request announcing MaxBody: each is refused at once, an
// unprivileged operator's requests having no body. Then it holds 1 000
// idle operator connections: the mediator keeps MaxHostConnsPerUID of
// them and refuses the rest, so its descriptors stay for everyone else.
func TestOperatorConnectionFlood(t *testing.T) {
	socket, med := attackedMediator(t)
	const bodies = 200
	big := stallHellos(t, socket, bodies, wire.MaxBody, true)
	if big.Errors != bodies {
		t.Errorf("of %d status requests announcing %d bytes from an unprivileged peer, %d were refused with an error (%+v), want all", bodies, wire.MaxBody, big.Errors, big)
	}
	const conns = 1000
	idle := stallHellos(t, socket, conns, 0, true)
	if idle.Held < 1 || idle.Held > mediator.MaxHostConnsPerUID || idle.Refused+idle.Failed < conns-mediator.MaxHostConnsPerUID {
		t.Errorf("of %d idle operator connections the mediator holds %d and refused %d, want at most %d held, the rest refused", conns, idle.Held, idle.Refused+idle.Failed, mediator.MaxHostConnsPerUID)
	}
	if st := status(t, socket); len(st.Nodes) != 1 {
		t.Errorf("status for root during the flood: %+v", st)
	}
	checkSurvived(t, socket, med)
}

// A tenant pipelines launches on 16 sessions without reading a reply. The
// mediator stops reading each session once its tenant has maxTenantInflight
// commands in flight, so the flooder's writes stall, the mediator stays
// small, and a victim is served meanwhile. Before the bound, launches on
// an idle stream were issued by the session's reader uncounted, and such a
// flood held 1.27 GB of node calls.
func TestLaunchFloodIsBounded(t *testing.T) {
	socket, med := attackedMediator(t)

	const sessions = 16
	var wg sync.WaitGroup
	sent := make([]int, sessions)
	stalled := make([]bool, sessions)
	var conns []net.Conn
	for i := range sessions {
		nc, buf := floodSession(t, socket)
		conns = append(conns, nc)
		wg.Go(func() { sent[i], stalled[i] = floodLaunches(nc, buf, 15*time.Second) })
	}
	wg.Wait()
	t.Logf("launches sent by each flooding session before its writes stalled: %v", sent)
	for i, ok := range stalled {
		if !ok {
			t.Errorf("session %d sent %d launches in 15s and never stalled: the mediator kept reading", i, sent[i])
		}
	}
	rss := memoryKiB(t, med.cmd.Process.Pid, "VmRSS") << 10
	t.Logf("mediator's resident memory with the flood stalled: %d MiB", rss>>20)
	checkSurvived(t, socket, med)
	for _, nc := range conns {
		nc.Close()
	}
	waitFor(t, "the flood's sessions to end", func() bool {
		for _, ts := range status(t, socket).Tenants {
			if ts.Tenant == "flood" {
				return false
			}
		}
		return true
	})
}

// floodSession opens a session of tenant "flood" and allocates a buffer
// for its launches.
func floodSession(t *testing.T, socket string) (net.Conn, uint64) {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	c := wire.NewConn(nc)
	call := func(op wire.Op, m api.Message) []byte {
		t.Helper()
		if err := c.WriteFrame(op, 0, 1, api.Encode(m)); err != nil {
			t.Fatal(err)
		}
		h, err := c.ReadHeader()
		if err != nil {
			t.Fatal(err)
		}
		body := make([]byte, h.Len)
		if err := c.ReadBody(body); err != nil {
			t.Fatal(err)
		}
		if h.Flags&wire.FlagError != 0 {
			t.Fatalf("%v: %v", op, wire.DecodeError(body))
		}
		return body
	}
	call(api.OpHello, &api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant, Tenant: "flood"})
	var r api.MallocReply
	if err := api.Decode(call(api.OpMalloc, &api.Malloc{Size: 4096}), &r); err != nil {
		t.Fatal(err)
	}
	return nc, r.Addr
}

// floodLaunches writes launches of saxpy on buf to nc, never reading a
// reply, until a write has made no progress for a second (stalled) or
// for d in all. It returns the launches written whole.
func floodLaunches(nc net.Conn, buf uint64, d time.Duration) (sent int, stalled bool) {
	body := api.Encode(&api.Launch{Kernel: "saxpy", Args: []api.Arg{
		{Kind: api.ArgI64, Bits: 1}, {Kind: api.ArgF32, Bits: 0x3f800000},
		{Kind: api.ArgBuffer, Bits: buf}, {Kind: api.ArgBuffer, Bits: buf},
	}})
	const perWrite = 512
	frame := wire.HeaderSize + len(body)
	chunk := make([]byte, 0, perWrite*frame)
	for i := range perWrite {
		var hdr [wire.HeaderSize]byte
		binary.LittleEndian.PutUint32(hdr[0:], uint32(len(body)))
		binary.LittleEndian.PutUint16(hdr[4:], uint16(api.OpLaunch))
		binary.LittleEndian.PutUint64(hdr[8:], uint64(i+2))
		chunk = append(append(chunk, hdr[:]...), body...)
	}
	end := time.Now().Add(d)
	written := 0
	for time.Now().Before(end) {
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := nc.Write(chunk)
		written += n
		if err != nil {
			var ne net.Error
			return written / frame, errors.As(err, &ne) && ne.Timeout()
		}
	}
	return written / frame, false
}
