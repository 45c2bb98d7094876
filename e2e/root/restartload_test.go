package root

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// soaker is one tenant running testimage --soak: a checked workload that
// runs rounds until SIGUSR1, then reads back every buffer it wrote first.
type soaker struct {
	name   string
	output func() string       // what it has printed so far
	stop   func() error        // SIGUSR1: finish the round, check, exit
	wait   func() (int, error) // its exit status once it ended
	alive  func() bool         // still running
}

var roundOK = regexp.MustCompile(`(?m)^round (\d+) ok$`)

// rounds is the number of the last round the soaker reported done, 0 if
// none.
func (s *soaker) rounds() int {
	m := roundOK.FindAllStringSubmatch(s.output(), -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

var soakSummary = regexp.MustCompile(`(?m)^soak: (\d+) rounds, (\d+) interrupted, longest (\S+), (\d+) buffers checked$`)

// hostSoaker runs the image's testimage --soak on the host as tenant,
// through the mediator's own socket.
func (h *harness) hostSoaker(t *testing.T, tenant string) *soaker {
	t.Helper()
	var out lockedBuffer
	cmd := exec.Command(h.rootfs+"/testimage", "--soak", "--socket", h.medSock, "--tenant", tenant)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return &soaker{
		name:   "host tenant " + tenant,
		output: out.String,
		stop:   func() error { return cmd.Process.Signal(syscall.SIGUSR1) },
		wait: func() (int, error) {
			select {
			case <-done:
			case <-time.After(time.Minute):
				return -1, fmt.Errorf("%s did not exit within a minute of SIGUSR1", tenant)
			}
			var ee *exec.ExitError
			if werr != nil && !errors.As(werr, &ee) {
				return -1, werr
			}
			return cmd.ProcessState.ExitCode(), nil
		},
		alive: func() bool {
			select {
			case <-done:
				return false
			default:
				return true
			}
		},
	}
}

// containerSoaker runs testimage --soak as the init of a Docker container
// under the vgpu runtime, granted 64MiB of team-a's quota.
func (h *harness) containerSoaker(t *testing.T) (*soaker, string) {
	t.Helper()
	args := append(dockerRun("vgpu", "-d", "-e", "VGPU_MEMORY=64MiB"), dockerImage, "/testimage", "--soak")
	id := strings.TrimSpace(h.docker(t, args...))
	t.Cleanup(func() { h.dockerCmd(context.Background(), "rm", "-f", id) })
	logs := func() string {
		out, _ := h.dockerCmd(context.Background(), "logs", id)
		return out
	}
	return &soaker{
		name:   "container " + id[:12],
		output: logs,
		stop: func() error {
			_, err := h.dockerCmd(context.Background(), "kill", "--signal", "USR1", id)
			return err
		},
		wait: func() (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := h.dockerCmd(ctx, "wait", id)
			if err != nil {
				return -1, fmt.Errorf("docker wait: %v: %s", err, out)
			}
			return strconv.Atoi(strings.TrimSpace(out))
		},
		alive: func() bool {
			out, err := h.dockerCmd(context.Background(), "inspect", "-f", "{{.State.Running}}", id)
			return err == nil && strings.TrimSpace(out) == "true"
		},
	}, id
}

// waitRounds waits until every soaker has reported at least want[i]
// rounds, failing the test if one ends first.
func waitRounds(t *testing.T, ss []*soaker, want []int, why string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for i, s := range ss {
		for s.rounds() < want[i] {
			if !s.alive() || time.Now().After(deadline) {
				t.Fatalf("%s: %s reported %d rounds, want %d (running: %v); its output:\n%s",
					why, s.name, s.rounds(), want[i], s.alive(), tail([]byte(s.output()), 15))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// tenantDiff names each field of vgpuctl tenants --json that differs
// between before and after, tenant by tenant.
func tenantDiff(before, after []api.TenantInfo) []string {
	byName := func(ts []api.TenantInfo) map[string]api.TenantInfo {
		m := map[string]api.TenantInfo{}
		for _, t := range ts {
			m[t.Name] = t
		}
		return m
	}
	b, a := byName(before), byName(after)
	var diffs []string
	for name := range b {
		if _, ok := a[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("tenant %s: listed before, not after", name))
		}
	}
	for name, at := range a {
		bt, ok := b[name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("tenant %s: listed after, not before", name))
			continue
		}
		bv, av := reflect.ValueOf(bt), reflect.ValueOf(at)
		for i := range bv.NumField() {
			if !reflect.DeepEqual(bv.Field(i).Interface(), av.Field(i).Interface()) {
				diffs = append(diffs, fmt.Sprintf("tenant %s: %s %v before, %v after", name, bv.Type().Field(i).Name, bv.Field(i).Interface(), av.Field(i).Interface()))
			}
		}
	}
	slices.Sort(diffs)
	return diffs
}

// Issue #22's first test: the mediator is SIGKILLed while three tenants —
// one the init of a Docker container under the vgpu runtime, two host
// processes of other tenants — run checked workloads (sgemm rounds checked
// against a reference, reads of the buffers they wrote first checked
// against their SHA-256) with data on the device; it is started again on
// its state directory. Each workload must have completed rounds before the
// kill, been blocked by it (its longest round spans the outage) and
// completed rounds after it, then finish with exit status 0 and every
// buffer it wrote before the kill intact. vgpuctl tenants shows, field by
// field, what it showed before the kill: reservations, containers and the
// sessions' allocations. The container's socket still serves a new
// program.
func TestMediatorKillUnderLoadLosesNothing(t *testing.T) {
	h := vgpuEnv(t)
	const outage = 1500 * time.Millisecond
	ctr, id := h.containerSoaker(t)
	ss := []*soaker{ctr, h.hostSoaker(t, "team-b"), h.hostSoaker(t, "team-c")}
	waitRounds(t, ss, []int{5, 5, 5}, "before the kill")

	before := h.tenants(t)
	for _, name := range []string{"team-a", "team-b", "team-c"} {
		if tenant(before, name).Allocated == 0 {
			t.Fatalf("tenant %s holds no device memory while its workload runs: %+v", name, before)
		}
	}
	if ta := tenant(before, "team-a"); ta.Containers != 1 || ta.Reserved != 64<<20 {
		t.Fatalf("tenant team-a while its container runs: %+v, want 1 container, 64MiB reserved", ta)
	}
	if st := h.status(t); len(st.Tenants) != 3 {
		t.Fatalf("%d sessions in the mediator before the kill, want 3: %+v", len(st.Tenants), st.Tenants)
	}

	killed := h.med
	atKill := make([]int, len(ss))
	for i, s := range ss {
		atKill[i] = s.rounds()
	}
	h.killMediator(t)
	if ws, ok := killed.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the mediator ended with %v, not by SIGKILL", killed.cmd.ProcessState)
	}
	time.Sleep(outage)
	for _, s := range ss {
		if !s.alive() {
			t.Fatalf("%s ended while the mediator was down:\n%s", s.name, tail([]byte(s.output()), 15))
		}
	}
	if err := h.serveMediator(); err != nil {
		t.Fatalf("the mediator started again: %v", err)
	}
	if h.med.cmd.Process.Pid == killed.cmd.Process.Pid {
		t.Fatalf("the mediator serving after the restart has the killed one's pid %d", killed.cmd.Process.Pid)
	}
	if d := tenantDiff(before, h.tenants(t)); len(d) > 0 {
		t.Fatalf("vgpuctl tenants after the mediator's kill and start differs from before:\n  %s\nmediator log:\n%s",
			strings.Join(d, "\n  "), h.med.tail(30))
	}

	want := make([]int, len(ss))
	for i, n := range atKill {
		want[i] = n + 10
	}
	waitRounds(t, ss, want, "after the restart")
	if got := lines(h.docker(t, "exec", id, "/testimage")); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("a new program in the container after the restart printed %q, want [ok]", got)
	}
	log, err := os.ReadFile(h.med.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "session restored; waiting for its tenant"); n != 3 {
		t.Errorf("the restarted mediator restored %d sessions, want 3:\n%s", n, h.med.tail(30))
	}
	if n := strings.Count(string(log), "session resumed by its tenant"); n != 3 {
		t.Errorf("%d sessions resumed by their tenants, want 3:\n%s", n, h.med.tail(30))
	}

	for _, s := range ss {
		if err := s.stop(); err != nil {
			t.Fatalf("stop %s: %v", s.name, err)
		}
	}
	for i, s := range ss {
		code, err := s.wait()
		out := s.output()
		if err != nil || code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "\nok") {
			t.Fatalf("%s ended with status %d (%v); its output:\n%s", s.name, code, err, tail([]byte(out), 15))
		}
		m := soakSummary.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s printed no summary:\n%s", s.name, tail([]byte(out), 15))
		}
		rounds, _ := strconv.Atoi(m[1])
		longest, err := time.ParseDuration(m[3])
		if err != nil {
			t.Fatalf("%s: summary %q: %v", s.name, m[0], err)
		}
		if rounds < want[i] {
			t.Errorf("%s: %d rounds in all, %d of them before the kill; want 10 more after it", s.name, rounds, atKill[i])
		}
		// A workload that runs across the outage has a round that waited
		// for the new mediator.
		if longest < outage*2/3 {
			t.Errorf("%s: its longest round took %v, shorter than the %v outage: the kill did not catch it mid-run", s.name, longest, outage)
		}
		t.Logf("%s: %d rounds before the kill; %s", s.name, atKill[i], m[0])
	}
	h.docker(t, "rm", "-f", id)
	h.waitIdle(t, 10*time.Second, "after the workloads ended and the container was removed")
}
