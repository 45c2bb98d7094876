package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/upgrade"
)

// slowBinary writes a wrapper that waits a second, so an upgrade to it is
// in progress long enough for a signal to arrive meanwhile, then runs
// then (a shell command line; "$@" are the mediator's arguments).
func slowBinary(t *testing.T, then string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "slow-mediator")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nsleep 1\n"+then+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// upgradeResult is what vgpuctl upgrade, run in the background, said.
type upgradeResult struct {
	rep upgrade.Report
	out string
	err error
}

// upgradeWhileSignalled runs vgpuctl upgrade to newBin, sends sig to the
// old mediator once it has started the new binary, and returns what the
// upgrade reported.
func upgradeWhileSignalled(t *testing.T, r *restartable, newBin string, sig syscall.Signal) upgradeResult {
	t.Helper()
	oldPid := r.med.cmd.Process.Pid
	done := make(chan upgradeResult, 1)
	go func() {
		var res upgradeResult
		args := []string{"--socket", r.socket, "upgrade", "--json", "--binary", newBin}
		res.out, res.err = run(t, "vgpuctl", args...)
		if i := strings.IndexByte(res.out, '{'); i >= 0 {
			if err := json.NewDecoder(strings.NewReader(res.out[i:])).Decode(&res.rep); err != nil {
				res.err = fmt.Errorf("vgpuctl upgrade --json: %v (%v)", err, res.err)
			}
		}
		done <- res
	}()
	waitFor(t, "the upgrade to start the new binary", func() bool {
		return strings.Contains(r.med.out.String(), "upgrade: starting the new binary")
	})
	if err := syscall.Kill(oldPid, sig); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.rep.NewPid != 0 {
			t.Cleanup(func() { stopPid(t, res.rep.NewPid) })
		}
		return res
	case <-time.After(time.Minute):
		t.Fatalf("vgpuctl upgrade did not answer in a minute\nmediator log:\n%s", r.med.out)
	}
	return upgradeResult{}
}

// serves reports whether a mediator accepts on socket.
func serves(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// A stop (SIGTERM) sent to the mediator while it upgrades waits for the
// upgrade: the new binary takes over and serves, vgpuctl gets its report,
// and then the stop reaches the process that serves, the new one; both
// processes end and nothing serves, as after any stop — never both
// serving, nor the old one gone with its successor half restored.
func TestStopDuringUpgrade(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	res := upgradeWhileSignalled(t, r, slowBinary(t, `exec "`+filepath.Join(bin, "vgpu-mediator")+`" "$@"`), syscall.SIGTERM)
	if res.err != nil || res.rep.NewPid == 0 || res.rep.NewPid == oldPid {
		t.Fatalf("vgpuctl upgrade with a stop during it: %v, report %+v\n%s\nmediator log:\n%s", res.err, res.rep, res.out, r.med.out)
	}
	waitFor(t, "the old mediator to exit", func() bool { return gone(oldPid) })
	waitFor(t, "the new mediator to stop", func() bool { return gone(res.rep.NewPid) })
	log := r.med.out.String()
	for _, want := range []string{"an upgrade is in progress: the signal waits", "upgrade: the successor serves", "a stop during the upgrade: passed on to the mediator that took over"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log does not say %q:\n%s", want, log)
		}
	}
	if serves(r.socket) {
		t.Fatal("a mediator still serves after the stop")
	}
}

// A stop during an upgrade that fails before the handover (the new binary
// exits) is honoured once the upgrade has failed: vgpuctl gets the
// failure, quoting the binary, and the mediator, which still served, stops.
func TestStopDuringFailedUpgrade(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	res := upgradeWhileSignalled(t, r, slowBinary(t, "echo 'vgpu-mediator: this build is broken' >&2; exit 1"), syscall.SIGTERM)
	if res.err == nil || res.rep.NewPid != 0 || !strings.Contains(res.out, "this build is broken") {
		t.Fatalf("vgpuctl upgrade to a broken binary with a stop during it: %v, report %+v\n%s", res.err, res.rep, res.out)
	}
	waitFor(t, "the mediator to stop", func() bool { return gone(oldPid) })
	if log := r.med.out.String(); !strings.Contains(log, "an upgrade is in progress: the signal waits") || strings.Contains(log, "handing over") {
		t.Fatalf("the log does not show the stop waiting for the failed upgrade:\n%s", log)
	}
	if serves(r.socket) {
		t.Fatal("a mediator still serves after the stop")
	}
}

// A reload (SIGHUP) sent to the mediator while it upgrades goes, once the
// upgrade is done, to the process that serves: the new one reloads its
// quota file, and serves on; the old one exits as after any upgrade.
func TestReloadDuringUpgrade(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	res := upgradeWhileSignalled(t, r, slowBinary(t, `exec "`+filepath.Join(bin, "vgpu-mediator")+`" "$@"`), syscall.SIGHUP)
	if res.err != nil || res.rep.NewPid == 0 {
		t.Fatalf("vgpuctl upgrade with a reload during it: %v, report %+v\n%s\nmediator log:\n%s", res.err, res.rep, res.out, r.med.out)
	}
	waitFor(t, "the old mediator to exit", func() bool { return gone(oldPid) })
	pid := fmt.Sprintf("pid=%d", res.rep.NewPid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		log := r.med.out.String()
		i := strings.Index(log, "SIGHUP: passed on to the mediator that took over")
		if line, _, _ := strings.Cut(log[max(i, 0):], "\n"); i >= 0 && strings.Contains(line, pid) && strings.Contains(log[i:], "quotas reloaded") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new mediator did not reload:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone(res.rep.NewPid) || !serves(r.socket) {
		t.Fatalf("the new mediator does not serve after the reload\n%s", r.med.out)
	}
}

// A SIGUSR2 (the signal path's handover) sent while an upgrade runs is
// ignored, saying why: the upgrade goes on to the new binary, which
// serves, rather than the mediator handing over a second time with no
// one to take over.
func TestHandoverSignalDuringUpgrade(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	res := upgradeWhileSignalled(t, r, slowBinary(t, `exec "`+filepath.Join(bin, "vgpu-mediator")+`" "$@"`), syscall.SIGUSR2)
	if res.err != nil || res.rep.NewPid == 0 {
		t.Fatalf("vgpuctl upgrade with a SIGUSR2 during it: %v, report %+v\n%s\nmediator log:\n%s", res.err, res.rep, res.out, r.med.out)
	}
	waitFor(t, "the old mediator to exit", func() bool { return gone(oldPid) })
	if log := r.med.out.String(); !strings.Contains(log, "SIGUSR2 ignored") || !strings.Contains(log, "an upgrade is in progress") || strings.Contains(log, "SIGUSR2: handing over") {
		t.Fatalf("the log does not show the SIGUSR2 ignored during the upgrade:\n%s", log)
	}
	if gone(res.rep.NewPid) || !serves(r.socket) {
		t.Fatalf("the new mediator does not serve\n%s", r.med.out)
	}
}

// A stop during an upgrade that fails after the handover (the new binary
// takes the sockets, then cannot listen on its status page's port, which
// is taken) waits for the roll back too: vgpuctl gets the failure and the
// roll back, and then the stop reaches the process that serves, the old
// binary started again, which stops; nothing serves, and no mediator is
// left running.
func TestStopDuringRollback(t *testing.T) {
	r := newRestartable(t)
	r.start()
	oldPid := r.med.cmd.Process.Pid
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failsLate := slowBinary(t, fmt.Sprintf(`exec "%s" "$@" --http %s`, filepath.Join(bin, "vgpu-mediator"), taken.Addr()))
	res := upgradeWhileSignalled(t, r, failsLate, syscall.SIGTERM)
	if res.err == nil || !res.rep.RolledBack || res.rep.NewPid == 0 || res.rep.NewPid == oldPid || !strings.Contains(res.out, "--http") {
		t.Fatalf("vgpuctl upgrade to a binary that fails while restoring, with a stop during it: %v, report %+v, want a roll back\n%s\nmediator log:\n%s", res.err, res.rep, res.out, r.med.out)
	}
	waitFor(t, "the old mediator to exit", func() bool { return gone(oldPid) })
	waitFor(t, "the rolled back mediator to stop", func() bool { return gone(res.rep.NewPid) })
	log := r.med.out.String()
	for _, want := range []string{"an upgrade is in progress: the signal waits", "upgrade failed after the handover; starting this mediator's own binary again"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log does not say %q:\n%s", want, log)
		}
	}
	i := strings.Index(log, "a stop during the upgrade: passed on to the mediator that took over")
	if line, _, _ := strings.Cut(log[max(i, 0):], "\n"); i < 0 || !strings.Contains(line, fmt.Sprintf("pid=%d", res.rep.NewPid)) {
		t.Fatalf("the log does not say the stop was passed on to the rolled back mediator, pid %d:\n%s", res.rep.NewPid, log)
	}
	// The old process and the rolled back one each say they stop on it.
	if n := strings.Count(log, "msg=stopping component=vgpu-mediator signal=terminated"); n != 2 {
		t.Fatalf("the log has %d stops on SIGTERM, want 2 (the old mediator's and the rolled back one's):\n%s", n, log)
	}
	if serves(r.socket) {
		t.Fatal("a mediator still serves after the stop")
	}
}
