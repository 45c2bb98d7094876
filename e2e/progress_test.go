package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/testenv"
)

// vgpuctl bench on a terminal: stderr shows one progress line, redrawn in
// place with each step's count, and cleared at the end; with --json, or
// with stderr piped, nothing is drawn. The output is the same report.
func TestBenchProgressOnATerminal(t *testing.T) {
	socket := startSystem(t, []string{"--memory", "256MiB"}, nil)
	tiny := []string{"--socket", socket, "bench", "--size", "64KiB", "--max-size", "64KiB", "--rounds", "1", "--window", "20ms", "--ops", "10",
		"--launches", "10", "--tenants", "0", "--decode-steps", "0", "--node-link", "0"}
	// onTTY runs vgpuctl with stderr on a pseudo-terminal, and returns its
	// stdout and what the terminal got.
	onTTY := func(args ...string) (stdout, term string) {
		master, tty := testenv.PTY(t, 100)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "vgpuctl"), args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, tty
		var got bytes.Buffer
		read := make(chan struct{})
		go func() { io.Copy(&got, master); close(read) }()
		if err := cmd.Run(); err != nil {
			t.Fatalf("vgpuctl %v: %v\n%s", args, err, out.String())
		}
		tty.Close() // the master reads EIO once no one holds the terminal
		<-read
		return out.String(), got.String()
	}

	out, term := onTTY(tiny...)
	if !strings.Contains(out, "|") {
		t.Errorf("no report on stdout:\n%s", out)
	}
	for _, want := range []string{"\rbench: host↔device copies of 4.0 KiB  [1/3]\x1b[K", "[3/3]\x1b[K", "\r\x1b[K"} {
		if !strings.Contains(term, want) {
			t.Errorf("the terminal lacks %q:\n%q", want, term)
		}
	}
	if strings.Contains(term, "\n") {
		t.Errorf("the progress line was not redrawn in place:\n%q", term)
	}

	out, term = onTTY(append(tiny, "--json")...)
	var report map[string]any
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Errorf("bench --json: %v\n%s", err, out)
	}
	if term != "" {
		t.Errorf("bench --json drew on the terminal: %q", term)
	}

	cmd := exec.Command(filepath.Join(bin, "vgpuctl"), tiny...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil || stderr.Len() != 0 {
		t.Errorf("bench with stderr piped: %v, stderr %q; want nothing there", err, stderr.String())
	}
}

// Every table of vgpuctl has --json, and status its wide view, against a
// real mediator.
func TestVgpuctlJSONAndWide(t *testing.T) {
	socket := startSystem(t, []string{"--memory", "256MiB"}, nil)
	for _, args := range [][]string{{"status", "--json"}, {"status", "-o", "json"}, {"tenants", "--json"}, {"kernels", "--json"}} {
		out, err := run(t, "vgpuctl", append([]string{"--socket", socket}, args...)...)
		var v any
		if err != nil || json.Unmarshal([]byte(out), &v) != nil {
			t.Errorf("vgpuctl %v: %v, not JSON:\n%s", args, err, out)
		}
	}
	out, err := run(t, "vgpuctl", "--socket", socket, "kernels", "--json")
	var ks []struct {
		Name   string
		Params []struct{ Name, Kind string }
	}
	if err != nil || json.Unmarshal([]byte(out), &ks) != nil || len(ks) == 0 || ks[0].Name == "" || len(ks[0].Params) == 0 {
		t.Errorf("kernels --json: %v\n%s", err, out)
	}
	out, err = run(t, "vgpuctl", "--socket", socket, "status", "-o", "wide")
	if err != nil || !strings.Contains(out, "TLB HITS") || !strings.Contains(out, "RESERVED") {
		t.Errorf("status -o wide: %v\n%s", err, out)
	}
}
