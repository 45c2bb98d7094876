package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/testenv"
)

// screenshotEnv, when "1", makes TestStatusPageInChromium write its
// screenshot to docs/statuspage.png (after letting the charts fill for a
// while); otherwise the tree is left alone.
const screenshotEnv = "VGPU_UPDATE_SCREENSHOT"

// TestStatusPageInChromium loads a real mediator's --http page in a headless
// Chromium while tenants of the test work: the page renders the tenants
// and their memory, its live part refreshes in place when a tenant
// allocates more, and when the mediator stops, it exits cleanly and the
// page says it is no longer updating.
func TestStatusPageInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Missing(t, "no chromium (apt-get install --no-install-recommends chromium): the status page's browser test needs it")
	}
	node := startNode(t, "--devices", "2", "--memory", "1GiB")
	dir := t.TempDir()
	socket, httpAddr := filepath.Join(dir, "mediator.sock"), freePort(t)
	med := startProc(t, "vgpu-mediator", "--socket", socket, "--node", node, "--state-dir", dir,
		"--quota", "", "--containerd", "", "--container-dir", filepath.Join(dir, "c"), "--log-level", "warn", "--http", httpAddr)
	base := "http://" + httpAddr
	waitFor(t, "the status page", func() bool {
		resp, err := http.Get(base + "/status.json")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// team-a holds two 12 MiB vectors and launches saxpy over them until
	// the test ends; team-b holds 8 MiB.
	const n = 3 << 20 // floats: 12 MiB
	a := dialTenant(t, socket, "team-a")
	x, y := mallocOK(t, a, 4*n), mallocOK(t, a, 4*n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopWork := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWork()
	wg.Go(func() {
		s := a.Stream()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			s.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(y))
			if err := s.Synchronize(); err != nil {
				t.Errorf("team-a's saxpy: %v", err)
				return
			}
		}
	})
	b := dialTenant(t, socket, "team-b")
	mallocOK(t, b, 8<<20)
	// A container registered as the runtime hook does, with this process
	// as its init, so that the mediator keeps it.
	op, err := client.DialOperator(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	const ctr = "statuspage0123456789"
	if _, err := op.Register(api.Register{Container: ctr, Namespace: "moby", Memory: 256 << 20, Pid: uint32(os.Getpid())}); err != nil {
		t.Fatal(err)
	}

	browserLog := &output{} // Chromium's, for a failure's message
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.WindowSize(1280, 1000),
		chromedp.CombinedOutput(browserLog))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx, cancel = chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	ctx, cancel = chromedp.NewContext(ctx)
	defer cancel()

	tenantRow, memCell := `#tenants tr[data-tenant="team-a"]`, `#tenants tr[data-tenant="team-a"] td.allocated`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(tenantRow)),
		chromedp.WaitVisible(chromedp.CSS(`#sessions tr[data-tenant="team-b"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#chart-tenant-memory polyline`)),
		chromedp.WaitVisible(chromedp.CSS(`#containers tr[data-container="`+ctr+`"]`)),
	); err != nil {
		t.Fatalf("load the page: %v\n%s", err, browserLog.String())
	}
	mem := textOf(ctx, t, memCell)
	if mem != "24.0 MiB" {
		t.Fatalf("team-a's memory on the page: %q, want 24.0 MiB", mem)
	}
	if d := textOf(ctx, t, "#devices"); !strings.Contains(d, node) || !strings.Contains(d, "1.0 GiB") {
		t.Errorf("devices table lacks node %s's 1 GiB devices:\n%s", node, d)
	}
	if c := textOf(ctx, t, `#containers tr[data-container="`+ctr+`"]`); !strings.Contains(c, "moby/statuspage01") || !strings.Contains(c, "256.0 MiB") {
		t.Errorf("container row %q, want moby/statuspage01 (its id cut to 12) with its 256 MiB", c)
	}
	legend := textOf(ctx, t, "#chart-tenant-memory .legend")
	if !strings.Contains(legend, "team-a") || !strings.Contains(legend, "team-b") {
		t.Errorf("memory chart's legend %q lacks team-a and team-b", legend)
	}
	// A mark on the document: a reload would erase it, the live refresh
	// keeps it.
	sampled, err := chromedp.Run(ctx, chromedp.Evaluate[int64](`window.vgpuMark = 7, Number(document.getElementById("sampled").dataset.time)`))
	if err != nil {
		t.Fatal(err)
	}

	mallocOK(t, a, 16<<20)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
		fmt.Sprintf(`document.querySelector(%q).dataset.bytes === "%d"`, memCell, 40<<20),
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("team-a's 40 MiB never showed on the page (still %q): %v", textOf(ctx, t, memCell), err)
	}
	if mem := textOf(ctx, t, memCell); mem != "40.0 MiB" {
		t.Errorf("team-a's memory after 16 MiB more: %q, want 40.0 MiB", mem)
	}
	after, err := chromedp.Run(ctx, chromedp.Evaluate[[]int64](`[window.vgpuMark || 0, Number(document.getElementById("sampled").dataset.time)]`))
	if err != nil {
		t.Fatal(err)
	}
	if after[0] != 7 || after[1] <= sampled {
		t.Errorf("after the refresh: mark %d, sampled at %d (before %d); want the mark kept (no reload) and a later sample", after[0], after[1], sampled)
	}
	if launches := textOf(ctx, t, `#sessions tr[data-tenant="team-a"] td.launches`); launches == "0" || launches == "" {
		t.Errorf("team-a's session shows %q launches, want some", launches)
	}
	// Device time needs two samples of team-a's running kernels.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector("#chart-device-time .legend").textContent.includes("team-a")`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Errorf("device time chart's legend %q never showed team-a, whose kernels run: %v", textOf(ctx, t, "#chart-device-time .legend"), err)
	}

	if os.Getenv(screenshotEnv) == "1" {
		// Let the charts draw some history: team-b grows for a while.
		for range 12 {
			time.Sleep(2 * time.Second)
			mallocOK(t, b, 6<<20)
		}
		time.Sleep(3 * time.Second)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(shot))
	if err != nil || cfg.Width < 1000 || cfg.Height < 500 {
		t.Fatalf("screenshot: %dx%d, %v; want a PNG of the 1280-wide window", cfg.Width, cfg.Height, err)
	}
	if os.Getenv(screenshotEnv) == "1" {
		if err := os.WriteFile(filepath.Join("..", "docs", "statuspage.png"), shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote docs/statuspage.png (%dx%d)", cfg.Width, cfg.Height)
	}

	// The mediator stops while the page keeps asking: it exits cleanly,
	// and the page says it is not updating.
	stopWork()
	med.cmd.Process.Signal(syscall.SIGTERM)
	if err := med.cmd.Wait(); err != nil || strings.Contains(med.out.String(), "panic") {
		t.Errorf("vgpu-mediator stopped with %v while the page refreshed:\n%s", err, med.out)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("state").className === "bad"`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("the page never said it stopped updating: %v", err)
	}
	if state := textOf(ctx, t, "#state"); !strings.Contains(state, "not updating") {
		t.Errorf("page state after the mediator stopped: %q", state)
	}
}

func dialTenant(t *testing.T, socket, tenant string) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mallocOK(t *testing.T, c *client.Client, size uint64) client.Ptr {
	t.Helper()
	p, err := c.Malloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// textOf is the text of the first element that sel matches.
func textOf(ctx context.Context, t *testing.T, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// TestStatusPageRefusesBadAddresses starts vgpu-mediator with a taken
// --http port and with an address beyond loopback: each exits at start
// with an error that names the address, having served nothing.
func TestStatusPageRefusesBadAddresses(t *testing.T) {
	taken := freePort(t)
	l, err := net.Listen("tcp", taken)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct{ addr, want string }{
		{taken, "--http " + taken + ": status page: listen tcp " + taken + ": bind: address already in use"},
		{"0.0.0.0:0", "--http 0.0.0.0:0 (--http-remote allows it): status page on 0.0.0.0:0: it would listen on "},
	} {
		dir := t.TempDir()
		socket := filepath.Join(dir, "mediator.sock")
		out, err := run(t, "vgpu-mediator", "--socket", socket, "--state-dir", dir, "--quota", "", "--containerd", "",
			"--log-level", "warn", "--http", c.addr)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, c.want) {
			t.Errorf("--http %s: %v, want exit 1 saying %q:\n%s", c.addr, err, c.want, out)
		}
		if _, err := os.Stat(socket); err == nil {
			t.Errorf("--http %s: the mediator opened its socket before refusing", c.addr)
		}
	}
}
