package root

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dockerRun is the start of every docker run of these tests: Docker's
// bridge is off, so containers have no network.
func dockerRun(runtime string, flags ...string) []string {
	return append([]string{"run", "--network", "none", "--runtime", runtime}, flags...)
}

// needRuntime fails a test that drives vgpu-runtime when it did not build.
func needRuntime(tb testing.TB, h *harness) {
	tb.Helper()
	if err := h.missing["vgpu-runtime"]; err != nil {
		tb.Fatalf("this test needs vgpu-runtime (cmd/vgpu-runtime): %v", err)
	}
}

// Issue test 1: docker run --runtime=vgpu -e VGPU_MEMORY=256MiB; the client
// inside finds its socket, allocates, runs sgemm on the remote node and
// checks the result against a pure-Go reference.
func TestDockerContainerRunsSgemmOnItsVGPU(t *testing.T) {
	h := vgpuEnv(t)
	args := append(dockerRun("vgpu", "--rm", "-e", "VGPU_MEMORY=256MiB"), dockerImage,
		"/bin/sh", "-c", `echo "socket=$VGPU_SOCKET"; ls /run/vgpu; exec /testimage --m 64 --n 64 --k 64`)
	out := h.docker(t, args...)
	want := []string{"socket=/run/vgpu/mediator.sock", "mediator.sock", "ok"}
	if got := lines(out); !slices.Equal(got, want) {
		t.Fatalf("container output = %q, want %q", got, want)
	}
	took := h.waitIdle(t, 10*time.Second, "after the container exited")
	t.Logf("mediator idle %v after docker run returned", took)
}

// Issue test 2: a request over the tenant's quota keeps the container from
// starting, with the mediator's message in docker run's output, and leaves
// nothing reserved; a request of exactly the cap still starts afterwards.
func TestDockerOverQuotaRequestFailsClearly(t *testing.T) {
	h := vgpuEnv(t)
	name := "vgpu-e2e-over-quota"
	args := append(dockerRun("vgpu", "--rm", "--name", name, "-e", "VGPU_MEMORY=1GiB"), dockerImage, "/tenant", "--n", "1000")
	start := time.Now()
	out, err := h.dockerCmd(context.Background(), args...)
	t.Logf("docker run refused after %v", time.Since(start))
	if err == nil {
		t.Fatalf("a container asking 1GiB of team-a's 512MiB started:\n%s", out)
	}
	if !strings.Contains(out, "quota exceeded") {
		t.Fatalf("docker run failed (%v) without the mediator's quota-exceeded message:\n%s", err, out)
	}
	t.Logf("docker run's refusal:\n%s", strings.TrimSpace(out))
	// The mediator's reason is on the first line, right after Docker's own
	// words, not at the end of runc's chain of hook errors.
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	if !strings.Contains(first, "OCI runtime create failed: vgpu: the mediator refused the container: ") ||
		!strings.Contains(first, `tenant "team-a": requested 1073741824 bytes (1.0 GiB)`) || !strings.Contains(first, "quota exceeded") ||
		strings.Contains(first, "error running hook") {
		t.Errorf("the first line of docker run's output is not the mediator's reason:\n%s", first)
	}
	if ids := lines(h.docker(t, "ps", "-aq", "--filter", "name="+name)); len(ids) > 0 {
		t.Errorf("the refused container is left in docker: %v", ids)
	}
	took := h.waitIdle(t, 10*time.Second, "after the refused start")
	t.Logf("mediator idle %v after docker run returned", took)
	for _, ti := range h.tenants(t) {
		if ti.Containers != 0 || ti.Reserved != 0 {
			t.Fatalf("tenant %q: %d containers, %d bytes reserved after a refused start", ti.Name, ti.Containers, ti.Reserved)
		}
	}
	// Nothing of the refused request is held: the whole cap is still there.
	args = append(dockerRun("vgpu", "--rm", "-e", "VGPU_MEMORY=512MiB"), dockerImage, "/tenant", "--n", "1000")
	if got := lines(h.docker(t, args...)); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("a request of exactly the cap after the refusal: output %q, want [ok]", got)
	}
	h.waitIdle(t, 10*time.Second, "after the at-cap container exited")
}

// Issue test 3: a container that asks for no vGPU runs exactly as under
// plain runc: the same output (environment, mounts, no /run/vgpu), and the
// same config.json in its bundle.
func TestDockerNoRequestRunsAsPlainRunc(t *testing.T) {
	h := env(t)
	needRuntime(t, h)
	// One stream (2>&1 inside), so that docker's merging of stdout and
	// stderr cannot reorder lines.
	script := `{ echo "args: $0 $*"; id; env | sort; cut -d" " -f5 /proc/self/mountinfo | sort; ls /run/vgpu; echo "ls: $?"; } 2>&1`
	outputs := map[string]string{}
	for _, rt := range []string{"runc", "vgpu"} {
		args := append(dockerRun(rt, "--rm", "--hostname", "e2e"), dockerImage, "/bin/sh", "-c", script, "zero", "one", "two")
		outputs[rt] = h.docker(t, args...)
	}
	if outputs["vgpu"] != outputs["runc"] {
		t.Errorf("output under --runtime=vgpu differs from --runtime=runc:\n%s", lineDiff(outputs["runc"], outputs["vgpu"]))
	}
	if !strings.Contains(outputs["runc"], "args: zero one two") || strings.Contains(outputs["runc"], "ls: 0") {
		t.Errorf("unexpected baseline output (want the args echoed and ls /run/vgpu to fail):\n%s", outputs["runc"])
	}
	if strings.Contains(outputs["vgpu"], "VGPU_SOCKET") {
		t.Errorf("the vgpu container without a request has VGPU_SOCKET:\n%s", outputs["vgpu"])
	}

	configs := map[string]string{}
	for _, rt := range []string{"runc", "vgpu"} {
		args := append(dockerRun(rt, "-d", "--hostname", "e2e"), dockerImage, "sleep", "60")
		id := strings.TrimSpace(h.docker(t, args...))
		t.Cleanup(func() { h.dockerCmd(context.Background(), "rm", "-f", id) })
		b, err := os.ReadFile(filepath.Join(h.ctdState, "io.containerd.runtime.v2.task", "moby", id, "config.json"))
		if err != nil {
			t.Fatalf("the bundle's config.json of the %s container: %v", rt, err)
		}
		configs[rt] = normalizeConfig(t, string(b), id)
	}
	if configs["vgpu"] != configs["runc"] {
		t.Errorf("config.json under --runtime=vgpu differs from --runtime=runc (container ids and sandbox keys normalized):\n%s",
			lineDiff(configs["runc"], configs["vgpu"]))
	}
	for _, bad := range []string{"/run/vgpu", "VGPU_SOCKET", "vgpu-hook"} {
		if strings.Contains(configs["vgpu"], bad) {
			t.Errorf("config.json of a container without a request mentions %q", bad)
		}
	}
}

var netnsKey = regexp.MustCompile(`netns/[0-9a-f]+`)

// normalizeConfig re-indents a bundle's config.json and replaces what
// differs between any two containers: their ids, sandbox keys and root
// filesystem mounts.
func normalizeConfig(tb testing.TB, config, id string) string {
	tb.Helper()
	config = strings.ReplaceAll(config, id, "<id>")
	config = netnsKey.ReplaceAllString(config, "netns/<sandbox>")
	var v map[string]any
	if err := json.Unmarshal([]byte(config), &v); err != nil {
		tb.Fatalf("config.json: %v", err)
	}
	if root, ok := v["root"].(map[string]any); ok {
		root["path"] = "<the container's overlay>"
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// lineDiff shows the lines only in a (-) and only in b (+), in order.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	inA, inB := map[string]int{}, map[string]int{}
	for _, l := range al {
		inA[l]++
	}
	for _, l := range bl {
		inB[l]++
	}
	var out []string
	for _, l := range al {
		if inB[l] == 0 {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if inA[l] == 0 {
			out = append(out, "+ "+l)
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("(same lines, different order or count)\n--- first:\n%s\n--- second:\n%s", a, b)
	}
	return strings.Join(out, "\n")
}

// Issue test 4: after the container exits the mediator holds nothing; and
// after kill -9 of the container's process from the host it holds nothing
// within 10 s.
func TestDockerReleasesOnExitAndOnKill(t *testing.T) {
	h := vgpuEnv(t)
	t.Run("exit", func(t *testing.T) {
		args := append(dockerRun("vgpu", "--rm", "-e", "VGPU_MEMORY=64MiB"), dockerImage, "/tenant", "--n", "100000")
		if got := lines(h.docker(t, args...)); !slices.Equal(got, []string{"ok"}) {
			t.Fatalf("output %q, want [ok]", got)
		}
		took := h.waitIdle(t, 10*time.Second, "after the container exited")
		t.Logf("mediator idle %v after docker run returned", took)
	})
	t.Run("kill-9", func(t *testing.T) {
		args := append(dockerRun("vgpu", "-d", "-e", "VGPU_MEMORY=64MiB"), dockerImage, "/tenant", "--n", "100000", "--hold", "5m")
		id := strings.TrimSpace(h.docker(t, args...))
		t.Cleanup(func() { h.dockerCmd(context.Background(), "rm", "-f", id) })
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := h.status(t)
			if len(st.Tenants) == 1 && st.Tenants[0].Mapped > 0 && st.Tenants[0].Launches == 3 {
				if st.Tenants[0].Tenant != "team-a" {
					t.Errorf("the container's session is tenant %q; Docker's namespace moby maps to team-a", st.Tenants[0].Tenant)
				}
				break
			}
			if running := strings.TrimSpace(h.docker(t, "inspect", "-f", "{{.State.Running}}", id)); running != "true" || time.Now().After(deadline) {
				logs, _ := h.dockerCmd(context.Background(), "logs", id)
				t.Fatalf("no session of the container in the mediator (running: %s; status %+v); container log:\n%s", running, st, logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if ta := tenant(h.tenants(t), "team-a"); ta.Containers != 1 || ta.Reserved != 64<<20 {
			t.Errorf("tenant team-a while the container runs: %d containers, %d bytes reserved; want 1, %d", ta.Containers, ta.Reserved, 64<<20)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(h.docker(t, "inspect", "-f", "{{.State.Pid}}", id)))
		if err != nil || pid <= 0 {
			t.Fatalf("container pid: %v", err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d: %v", pid, err)
		}
		took := h.waitIdle(t, 10*time.Second, "after kill -9 of the container's process")
		t.Logf("mediator idle %v after kill -9", took)
		if st := strings.TrimSpace(h.docker(t, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", id)); st != "exited 137" {
			t.Errorf("container state after kill -9: %q, want \"exited 137\"", st)
		}
	})
}

// BenchmarkDockerRun measures start-to-exit time of docker run --rm of
// /bin/true with --runtime=vgpu and a vGPU request against
// --runtime=runc, same image, 20 runs each, interleaved; it reports the
// medians and their ratio. It ignores b.N: run it with -benchtime 1x.
func BenchmarkDockerRun(b *testing.B) {
	h := vgpuEnv(b)
	const samples = 20
	timed := func(args ...string) time.Duration {
		start := time.Now()
		h.docker(b, append(args, dockerImage, "/bin/true")...)
		return time.Since(start)
	}
	vgpu := func() time.Duration { return timed(dockerRun("vgpu", "--rm", "-e", "VGPU_MEMORY=64MiB")...) }
	plain := func() time.Duration { return timed(dockerRun("runc", "--rm")...) }
	vgpu() // warm both paths up
	plain()
	var tv, tp []time.Duration
	b.ResetTimer()
	for range samples {
		tv = append(tv, vgpu())
		tp = append(tp, plain())
	}
	b.StopTimer()
	mv, mp := median(tv), median(tp)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(mv.Microseconds())/1000, "vgpu-ms/run")
	b.ReportMetric(float64(mp.Microseconds())/1000, "runc-ms/run")
	b.ReportMetric(float64(mv)/float64(mp), "vgpu/runc")
	b.Logf("docker run --rm /bin/true, median of %d: vgpu runtime with VGPU_MEMORY=64MiB %v, runc %v, ratio %.2f",
		samples, mv, mp, float64(mv)/float64(mp))
	h.waitIdle(b, 10*time.Second, "after the benchmark")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
