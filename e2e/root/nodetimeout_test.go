package root

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/netlab"
)

// TestNetlabNodeTimeout partitions a node while a tenant's synchronous call
// to it is in flight: the call fails with api.ErrUnavailable, naming the
// node and how long it was silent, once the node has been silent for the
// mediator's --node-timeout (not before, and within 3 times that), while
// another tenant's session on another node is served throughout. The
// partitioned node drops the mediator's connections after its own
// --mediator-timeout, keeping their frames for a reclaim (every session's
// node connections attach: a journaled one's for the node's
// --reattach-grace, one with no journal for the mediator's --drop-grace),
// and once healed serves new sessions.
func TestNetlabNodeTimeout(t *testing.T) {
	lab := netlab.New(t, "n1", "n2", "m")
	bin := netlabBinaries(t)
	const bound = 2 * time.Second

	const port = 7070
	nodes := map[string]*netlab.Proc{}
	for _, n := range []string{"n1", "n2"} {
		addr := lab.Addr(n, port)
		nodes[n] = startLabNode(t, lab, bin, n, addr, "m", "--devices", "1", "--memory", "64MiB",
			"--mediator-timeout", bound.String(), "--log-level", "info")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	startLabMediator(t, lab, bin, "m", sock, dir, "--node", lab.Addr("n1", port), "--node", lab.Addr("n2", port),
		"--node-timeout", bound.String(), "--log-level", "info")
	// Sessions go to the least used device, the first node's first: a's
	// device is n1's, b's n2's.
	sessions := map[string]*netlabSession{}
	for _, name := range []string{"a", "b"} {
		s, err := openNetlabSession(sock, "tenant-"+name)
		if err != nil {
			t.Fatalf("session %s: %v", name, err)
		}
		t.Cleanup(func() { s.c.Close() })
		if _, err := s.fastest(3); err != nil {
			t.Fatalf("session %s: %v", name, err)
		}
		sessions[name] = s
	}

	// A round trip just before the cut is the node's last sign of life.
	if _, err := sessions["a"].fastest(1); err != nil {
		t.Fatal(err)
	}
	alive := time.Now()
	lab.Cut("n1")
	cutAt := time.Now()
	type result struct {
		err  error
		took time.Duration // since alive
	}
	a := make(chan result, 1)
	go func() {
		_, err := sessions["a"].fastest(1)
		a <- result{err, time.Since(alive)}
	}()
	bOps := 0
	var got result
wait:
	for {
		select {
		case got = <-a:
			break wait
		default:
		}
		if time.Since(alive) > 3*bound+10*time.Second {
			t.Fatalf("a's call to the cut-off n1 neither succeeded nor failed within %v", time.Since(alive))
		}
		if _, err := sessions["b"].fastest(1); err != nil {
			t.Fatalf("b's session on n2 while n1 is cut off (after %d round trips): %v", bOps, err)
		}
		bOps++
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("n1 cut %v after its last answer; a's call failed %v after it: %v; b made %d round trips meanwhile",
		cutAt.Sub(alive), got.took, got.err, bOps)
	if !errors.Is(got.err, api.ErrUnavailable) {
		t.Fatalf("a's call to the cut-off n1: %v, want api.ErrUnavailable", got.err)
	}
	for _, want := range []string{lab.Addr("n1", port), "silent for"} {
		if !strings.Contains(got.err.Error(), want) {
			t.Errorf("a's error %q does not say %q", got.err, want)
		}
	}
	if got.took < bound-100*time.Millisecond {
		t.Errorf("a's call failed %v after n1's last answer: before the %v node timeout", got.took, bound)
	}
	if got.took > 3*bound {
		t.Errorf("a's call failed %v after n1's last answer: want within 3 × the %v node timeout", got.took, bound)
	}
	if bOps == 0 {
		t.Errorf("b made no round trip while a's call waited")
	}
	if _, err := sessions["b"].fastest(3); err != nil {
		t.Errorf("b's session on n2 after a's failed: %v", err)
	}

	// The node notices too: it drops the mediator's connections once the
	// mediator has been silent for its own timeout, parking their frames
	// for a reclaim rather than freeing them.
	waitFor(t, time.Until(cutAt.Add(3*bound))+time.Second, "n1 to drop the silent mediator's connections, keeping their frames", func() bool {
		b, _ := os.ReadFile(nodes["n1"].Log)
		return strings.Contains(string(b), "silent for") && strings.Contains(string(b), "its frames are kept for a reclaim")
	})

	lab.Heal("n1")
	s, err := openNetlabSession(sock, "tenant-healed")
	if err != nil {
		t.Fatalf("new session after n1 healed: %v", err)
	}
	defer s.c.Close()
	if _, err := s.fastest(1); err != nil {
		t.Errorf("new session after n1 healed: %v", err)
	}
}
