package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refusingRuntime fails a create as runc 1.1 does when vgpu-hook's
// registration is refused: it logs its own error, the hook's stderr at the
// end of its chain, and exits 1. It first says which descriptors it has.
const refusingRuntime = `#!/bin/sh
ls /proc/$$/fd > "$VGPU_TEST_RECORD.fds"
printf '%s\n' '{"level":"warning","msg":"an earlier line","time":"2026-12-01T20:00:00Z"}' >> "$LOG"
printf '%s\n' '{"level":"error","msg":"runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: vgpu-hook: the mediator refused the container: admit container \"ctr1\" of namespace \"moby\": tenant \"team-a\": requested 1073741824 bytes (1.0 GiB), reserved 0 bytes, cap 536870912 bytes (512.0 MiB): quota exceeded\n  (register container ctr1 (namespace \"moby\"))","time":"2026-12-01T20:00:01Z"}' >> "$LOG"
exit "${FAKE_EXIT:-1}"
`

// A create of a container that asks for a vGPU, refused by the mediator
// inside runc, ends with the mediator's reason as the last error of the
// runtime's log (what containerd and Docker show), on its first line, with
// runc's chain below it; runc's exit status is the wrapper's, and runc had
// the descriptors the wrapper was given (--preserve-fds).
func TestCreateRefusedByTheMediatorSaysWhyFirst(t *testing.T) {
	e := newEnv(t)
	if err := os.WriteFile(e.runtime, []byte(refusingRuntime), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1GiB"}, nil))
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	args := append([]string{"--vgpu-tenant", "team-a", "--vgpu-runtime", e.runtime, "--vgpu-state", e.state}, e.docker()...)
	cmd := exec.Command(filepath.Join(binDir, "vgpu-runtime"), append(args, "create", "--bundle", b, "--preserve-fds", "1", "ctr1")...)
	cmd.Env = append(os.Environ(), "VGPU_TEST_RECORD="+e.record, "LOG="+e.log, "FAKE_EXIT=7")
	cmd.ExtraFiles = []*os.File{extra} // fd 3
	cmd.Dir = e.dir
	out, err := cmd.CombinedOutput()
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 7 {
		t.Fatalf("exit %v, want runc's 7; output %q", err, out)
	}
	fds, _ := os.ReadFile(e.record + ".fds")
	if !slices.Contains(strings.Fields(string(fds)), "3") {
		t.Errorf("runc had descriptors %q; want the wrapper's fd 3 among them", fds)
	}
	raw, _ := os.ReadFile(e.log)
	lines := bytes.Split(bytes.TrimSpace(raw), []byte("\n"))
	var last struct{ Level, Msg string }
	if err := json.Unmarshal(lines[len(lines)-1], &last); err != nil || last.Level != "error" {
		t.Fatalf("last log line %q: %+v, %v", lines[len(lines)-1], last, err)
	}
	first, rest, _ := strings.Cut(last.Msg, "\n")
	want := `vgpu: the mediator refused the container: admit container "ctr1" of namespace "moby": tenant "team-a": ` +
		`requested 1073741824 bytes (1.0 GiB), reserved 0 bytes, cap 536870912 bytes (512.0 MiB): quota exceeded`
	if first != want {
		t.Errorf("first line of the last error\n %q\nwant\n %q", first, want)
	}
	if !strings.HasPrefix(rest, "runc create failed: ") {
		t.Errorf("runc's chain is not below the reason: %q", rest)
	}
}

// A create that fails for any other reason leaves runc's error last, as it
// is, and its exit status.
func TestCreateFailingOtherwiseKeepsRuncsError(t *testing.T) {
	e := newEnv(t)
	script := "#!/bin/sh\nprintf '%s\\n' '{\"level\":\"error\",\"msg\":\"runc create failed: no such file\"}' >> \"$LOG\"\nexit 1\n"
	if err := os.WriteFile(e.runtime, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1GiB"}, nil))
	args := append([]string{"--vgpu-tenant", "team-a", "--vgpu-runtime", e.runtime, "--vgpu-state", e.state}, e.docker()...)
	cmd := exec.Command(filepath.Join(binDir, "vgpu-runtime"), append(args, "create", "--bundle", b, "ctr1")...)
	cmd.Env = append(os.Environ(), "LOG="+e.log)
	if err := cmd.Run(); err == nil {
		t.Fatal("a failed create exited 0")
	}
	raw, _ := os.ReadFile(e.log)
	if got := strings.TrimSpace(string(raw)); got != `{"level":"error","msg":"runc create failed: no such file"}` {
		t.Errorf("log %q: the wrapper added to it", got)
	}
}

// slowRuntime stands for a create that takes its time: it says it started,
// notes a SIGTERM it gets, and otherwise sleeps.
const slowRuntime = `#!/bin/sh
trap 'echo term > "$VGPU_TEST_RECORD.term"; exit 143' TERM
echo $$ > "$VGPU_TEST_RECORD.pid"
while :; do sleep 0.05; done
`

// While runc creates, a SIGTERM to the wrapper reaches runc, and runc's
// status is the wrapper's; a SIGKILL of the wrapper kills runc too
// (Pdeathsig), so no create outlives the one its caller gave up on.
func TestCreateSignalsReachRunc(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			e := newEnv(t)
			if err := os.WriteFile(e.runtime, []byte(slowRuntime), 0o755); err != nil {
				t.Fatal(err)
			}
			b, _ := e.bundle(t, specJSON([]string{"VGPU_MEMORY=1GiB"}, nil))
			args := append([]string{"--vgpu-tenant", "team-a", "--vgpu-runtime", e.runtime, "--vgpu-state", e.state}, e.docker()...)
			cmd := exec.Command(filepath.Join(binDir, "vgpu-runtime"), append(args, "create", "--bundle", b, "ctr1")...)
			cmd.Env = append(os.Environ(), "VGPU_TEST_RECORD="+e.record)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var runc int
			deadline := time.Now().Add(10 * time.Second)
			for runc == 0 && time.Now().Before(deadline) {
				raw, _ := os.ReadFile(e.record + ".pid")
				runc, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
				time.Sleep(10 * time.Millisecond)
			}
			if runc == 0 {
				cmd.Process.Kill()
				t.Fatal("runc did not start")
			}
			cmd.Process.Signal(sig)
			err := cmd.Wait()
			ee, _ := errors.AsType[*exec.ExitError](err)
			if sig == syscall.SIGTERM {
				if ee == nil || ee.ExitCode() != 143 {
					t.Errorf("wrapper: %v; want runc's exit 143", err)
				}
				if raw, _ := os.ReadFile(e.record + ".term"); string(raw) != "term\n" {
					t.Error("runc did not get the SIGTERM")
				}
				return
			}
			for syscall.Kill(runc, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if syscall.Kill(runc, 0) == nil {
				syscall.Kill(runc, syscall.SIGKILL)
				t.Error("runc outlived the wrapper's SIGKILL")
			}
		})
	}
}
