package bench

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/models"
	"github.com/vgpu/vgpu/mediator"
)

// startSystem starts a sim node of devs devices of size bytes and a
// mediator in front of it, in this process, and returns the mediator's
// socket (the setup of mediator/harness_test.go, which is not exported).
func startSystem(t *testing.T, devs int, size uint64) string {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	dir, err := os.MkdirTemp("", "vgpu-bench") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node, addr, err := accelerator.StartSim("127.0.0.1:0", devs, size, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	m, err := mediator.New(mediator.Config{Nodes: []string{addr.String()}, ContainerDir: filepath.Join(dir, "c"), StateDir: dir, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "m.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(l)
	t.Cleanup(func() { m.Close() })
	return socket
}

// tinyDLRM is a model small enough for the race detector.
var tinyDLRM = DLRMShape{TableBytes: 4 << 20, Dim: 16, Batch: 8, Pooling: 4, Hidden: 16, Out: 8, Steps: 3}

// The whole suite at tiny sizes against a real node and mediator: every
// figure is measured, every check passes, and the reports come out.
func TestSuiteEndToEnd(t *testing.T) {
	socket := startSystem(t, 2, 64<<20)
	var heard []string
	r, err := Run(Options{
		Socket: socket, Command: "go test", BulkBytes: 64 << 10, MaxBytes: 1 << 20, Rounds: 1, SmallOps: 20, Launches: 200,
		Tenants: []int{1, 2}, DLRM: tinyDLRM, NodeLinkBytes: 2 << 20,
		Progress: func(s string) { heard = append(heard, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Transfers) != 3 || r.Transfers[0].Bytes != 4<<10 || r.Transfers[2].Bytes != 1<<20 || r.Transfers[0].Reps != maxReps {
		t.Fatalf("transfers %+v", r.Transfers)
	}
	for _, tr := range r.Transfers {
		if !(tr.MemcpyMBps > 0 && tr.RawTCPMBps > 0 && tr.H2DMBps > 0 && tr.D2HMBps > 0 && tr.H2DRatio > 0 && tr.D2HRatio > 0) {
			t.Errorf("transfer %+v", tr)
		}
	}
	if !r.HostAlloc || r.BulkBytes != 64<<10 || r.H2DRatio != r.Transfers[1].H2DRatio || r.D2HRatio != r.Transfers[1].D2HRatio || !(r.MemcpyMBps > 0) {
		t.Errorf("headline %+v", r)
	}
	if !(r.SmallOpUs > 0 && r.RawPingPongUs > 0 && r.SmallOpRatio > 0 && r.LaunchesPerS > 0) {
		t.Errorf("small operations %+v", r)
	}
	if r.NodeLinkReport == nil || !(r.NodeLinkReport.Ratio > 0) {
		t.Errorf("node link %+v", r.NodeLinkReport)
	}
	if len(r.DLRM) != 4 {
		t.Fatalf("dlrm %+v", r.DLRM)
	}
	for i, d := range r.DLRM {
		if d.Tenants != []int{1, 1, 2, 2}[i] || d.Hints != (i%2 == 1) || d.Steps != d.Tenants*tinyDLRM.Steps || !(d.StepsPerS > 0) {
			t.Errorf("dlrm[%d] = %+v", i, d)
		}
		// Every run sends the model to the node once at least, and each
		// step's inputs and outputs.
		if d.LoadBytes < uint64(tinyDLRM.TableBytes) || d.StepBytes == 0 {
			t.Errorf("dlrm[%d] moved %d bytes loading, %d stepping", i, d.LoadBytes, d.StepBytes)
		}
		// A tenant back after every session ended finds its sealed weights
		// still on the node, with hints; without them it is sent them all.
		if d.Hints && (d.ReloadBytes >= uint64(tinyDLRM.TableBytes)/2 || !(d.ReloadRatio > 2)) ||
			!d.Hints && d.ReloadBytes < uint64(tinyDLRM.TableBytes) {
			t.Errorf("dlrm[%d]: reload moved %d bytes, ratio %.2f", i, d.ReloadBytes, d.ReloadRatio)
		}
	}
	// With two tenants and hints, the second tenant's weights are not sent
	// again.
	two, twoHinted := r.DLRM[2], r.DLRM[3]
	if twoHinted.DedupBytes == 0 || twoHinted.LoadBytes >= two.LoadBytes || !(twoHinted.BytesRatio > 1) || r.HintBytesRatio != twoHinted.BytesRatio {
		t.Errorf("hints saved nothing: without %+v, with %+v", two, twoHinted)
	}
	if len(heard) == 0 {
		t.Error("no progress reported")
	}

	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, JSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"h2d_ratio", "d2h_ratio", "small_op_ratio", "launches_per_s", "node_tls_ratio", "hint_bytes_ratio", "dlrm_2_tenants_bytes_ratio"} {
		if v, ok := m[k].(float64); !ok || !(v > 0) {
			t.Errorf("%s = %v", k, m[k])
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, SVGFile))
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, svg)
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	if err != nil || !strings.Contains(string(md), "`go test`") {
		t.Errorf("markdown: %v\n%s", err, md)
	}
}

// A DLRM step whose output differs from the reference fails the run: the
// check is real.
func TestDLRMCheckCatchesWrongOutput(t *testing.T) {
	socket := startSystem(t, 1, 32<<20)
	sh := tinyDLRM
	sh.Defaults(1 << 30)
	m := models.NewDLRM(sh, 1)
	m.Batches[1].Want[3] += 0.5
	_, err := runDLRM(socket, m, 1, false)
	if !errors.Is(err, api.ErrInternal) || !strings.Contains(err.Error(), "batch 1") {
		t.Fatalf("err %v, want a mismatch of batch 1", err)
	}
}

func TestRunRejectsBadTenantCount(t *testing.T) {
	if _, err := Run(Options{Socket: "/nonexistent", Tenants: []int{2, 0}}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("err %v", err)
	}
}
