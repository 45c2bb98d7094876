package statuspage_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/systest"
	"github.com/vgpu/vgpu/mediator"
	"github.com/vgpu/vgpu/statuspage"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return l
}

// startMediator starts a sim node and a mediator in front of it, in this
// process, and returns the mediator's socket and the mediator.
func startMediator(t *testing.T) (string, *mediator.Mediator) {
	t.Helper()
	m, socket := systest.StartWith(t, systest.Options{Devices: 1, Size: 256 << 20})
	return socket, m
}

// startPage serves the status page of the mediator at socket on a free
// loopback port, sampling every 50ms.
func startPage(t *testing.T, socket string) *statuspage.Server {
	t.Helper()
	src := statuspage.NewOperatorSource(socket, 5*time.Second)
	t.Cleanup(func() { src.Close() })
	p, err := statuspage.Listen(statuspage.Config{Addr: "127.0.0.1:0", Source: src, Interval: 50 * time.Millisecond, Window: 10 * time.Second, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	p.Serve()
	t.Cleanup(func() { p.Close() })
	return p
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// snapshot reads /status.json.
func snapshot(t *testing.T, base string) statuspage.Snapshot {
	t.Helper()
	code, body := get(t, base+"/status.json")
	if code != http.StatusOK {
		t.Fatalf("/status.json: %d %s", code, body)
	}
	var s statuspage.Snapshot
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("/status.json: %v\n%s", err, body)
	}
	return s
}

func allocated(s statuspage.Snapshot, tenant string) uint64 {
	for _, ti := range s.Tenants {
		if ti.Name == tenant {
			return ti.Allocated
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestServesTheMediatorsStatus(t *testing.T) {
	socket, m := startMediator(t)
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Malloc(0, 8<<20); err != nil {
		t.Fatal(err)
	}
	p := startPage(t, socket)
	base := "http://" + p.Addr().String()

	// The first page has data: Serve sampled before serving.
	code, html := get(t, base+"/")
	if code != http.StatusOK || !strings.Contains(html, `data-tenant="alice"`) || !strings.Contains(html, "8.0 MiB") {
		t.Fatalf("/: %d, want the page with alice's 8 MiB:\n%s", code, html)
	}
	s := snapshot(t, base)
	if s.Status == nil || len(s.Status.Nodes) != 1 || allocated(s, "alice") != 8<<20 {
		t.Fatalf("/status.json: %+v, want one node and alice with 8 MiB", s)
	}
	// It is the operator socket's view: the same as the mediator's own.
	if got, want := len(s.Status.Tenants), len(m.Status().Tenants); got != want {
		t.Fatalf("/status.json has %d sessions, the mediator %d", got, want)
	}

	// Live: more memory shows in a later sample, and the history grows.
	if _, err := c.Malloc(0, 8<<20); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alice's 16 MiB in /status.json", func() bool { s = snapshot(t, base); return allocated(s, "alice") == 16<<20 })
	if len(s.History) < 2 || s.History[len(s.History)-1].TenantMemory["alice"] != 16<<20 {
		t.Fatalf("history %+v, want samples ending with alice's 16 MiB", s.History)
	}
	if code, live := get(t, base+"/live"); code != http.StatusOK || !strings.Contains(live, "16.0 MiB") || strings.Contains(live, "<html") {
		t.Fatalf("/live: %d\n%s", code, live)
	}

	for _, c := range []struct {
		method, path, host string
		want               int
	}{
		{"GET", "/nope", "", http.StatusNotFound},
		{"GET", "/status.json/x", "", http.StatusNotFound},
		{"POST", "/", "", http.StatusMethodNotAllowed},
		{"GET", "/", "evil.example:80", http.StatusForbidden}, // DNS rebinding
		{"GET", "/", "localhost:1234", http.StatusOK},
		{"GET", "/", "[::1]", http.StatusOK},
	} {
		req, err := http.NewRequest(c.method, base+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s (Host %q): %d, want %d", c.method, c.path, c.host, resp.StatusCode, c.want)
		}
	}
}

func TestRefusesATakenPortAndAnAddressBeyondLoopback(t *testing.T) {
	socket, _ := startMediator(t)
	src := statuspage.NewOperatorSource(socket, 5*time.Second)
	defer src.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	_, err = statuspage.Listen(statuspage.Config{Addr: addr, Source: src, Log: quietLog()})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("a taken port: %v, want an error naming %s in use", err, addr)
	}
	for _, a := range []string{"0.0.0.0:0", ":0"} {
		_, err := statuspage.Listen(statuspage.Config{Addr: a, Source: src, Log: quietLog()})
		if !errors.Is(err, api.ErrPermissionDenied) || !strings.Contains(err.Error(), a) {
			t.Fatalf("%s without AllowRemote: %v, want permission denied naming it", a, err)
		}
	}
	p, err := statuspage.Listen(statuspage.Config{Addr: "0.0.0.0:0", AllowRemote: true, Source: src, Log: quietLog()})
	if err != nil {
		t.Fatalf("0.0.0.0:0 with AllowRemote: %v", err)
	}
	// Closed without serving, it listens no more.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", p.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("%s still accepts after Close", p.Addr())
	}
	if _, err := statuspage.Listen(statuspage.Config{Addr: "127.0.0.1:0", Log: quietLog()}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("no source: %v, want invalid argument", err)
	}
}

// TestClosesWhileBrowsersAsk closes the page while clients load it over
// and over: every answer is a whole page or a refused connection, Close
// does not wait for the clients, and nothing serves afterwards.
func TestClosesWhileBrowsersAsk(t *testing.T) {
	socket, _ := startMediator(t)
	src := statuspage.NewOperatorSource(socket, 5*time.Second)
	defer src.Close()
	p, err := statuspage.Listen(statuspage.Config{Addr: "127.0.0.1:0", Source: src, Interval: 20 * time.Millisecond, Window: time.Second, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	p.Serve()
	base := "http://" + p.Addr().String()
	var whole, refused atomic.Int64
	var bad sync.Map
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Go(func() {
			hc := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
			for path := []string{"/", "/live", "/status.json"}[i%3]; ; {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := hc.Get(base + path)
				if err != nil {
					refused.Add(1)
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					refused.Add(1) // cut mid-body: a broken connection, not a wrong page
				case resp.StatusCode == http.StatusOK && (strings.HasSuffix(string(b), "</html>") || strings.Contains(string(b), "Sampled at") || json.Valid(b)):
					whole.Add(1)
				default:
					bad.Store(fmt.Sprintf("%s: %d %q", path, resp.StatusCode, b), true)
				}
			}
		})
	}
	waitFor(t, "clients to load pages", func() bool { return whole.Load() >= 50 })
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v with clients asking", d)
	}
	before := refused.Load()
	waitFor(t, "clients to be refused after Close", func() bool { return refused.Load() > before+10 })
	close(stop)
	wg.Wait()
	bad.Range(func(k, _ any) bool { t.Errorf("answer neither whole nor refused: %s", k); return true })
	if _, err := http.Get(base + "/"); err == nil {
		t.Errorf("the page still serves after Close")
	}
	if err := p.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	t.Logf("%d whole answers, %d refused", whole.Load(), refused.Load())
}

// TestKeepsTheLastStatusWhenTheMediatorStops stops the mediator under the
// page: the page goes on serving, with the last status and why it is old.
func TestKeepsTheLastStatusWhenTheMediatorStops(t *testing.T) {
	socket, m := startMediator(t)
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Malloc(0, 4<<20); err != nil {
		t.Fatal(err)
	}
	p := startPage(t, socket)
	base := "http://" + p.Addr().String()
	if s := snapshot(t, base); allocated(s, "bob") != 4<<20 {
		t.Fatalf("bob's memory %d, want 4 MiB", allocated(s, "bob"))
	}
	defer c.Close()
	m.Close() // with bob's session open, so that no sample sees it end first
	var s statuspage.Snapshot
	waitFor(t, "the page to say the mediator did not answer", func() bool { s = snapshot(t, base); return s.Error != "" })
	if allocated(s, "bob") != 4<<20 {
		t.Errorf("after the mediator stopped: bob's memory %d, want the last status's 4 MiB", allocated(s, "bob"))
	}
	if code, html := get(t, base+"/"); code != http.StatusOK || !strings.Contains(html, "The mediator did not answer") || !strings.Contains(html, `data-tenant="bob"`) {
		t.Errorf("page after the mediator stopped: %d\n%s", code, html)
	}
}
