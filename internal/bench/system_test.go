package bench

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/models"
	"github.com/vgpu/vgpu/internal/systest"
)

// tinyDecoder is the decoder part small enough for the race detector.
var tinyDecoder = DecoderOptions{
	Model: models.GPTConfig{Vocab: 64, DModel: 32, Heads: 2, Layers: 2, Context: 24, Seed: 5}, Prompt: 4, Steps: 8, Rounds: 2, FloodSteps: 8, LoadTenants: 3,
}

// tinyDLRM is a model small enough for the race detector.
var tinyDLRM = DLRMShape{TableBytes: 4 << 20, Dim: 16, Batch: 8, Pooling: 4, Hidden: 16, Out: 8, Steps: 3}

// The whole suite at tiny sizes against a real node and mediator: every
// figure is measured, every check passes, and the reports come out.
func TestSuiteEndToEnd(t *testing.T) {
	socket := systest.Start(t, 2, 64<<20)
	var heard []string
	r, err := Run(Options{
		Socket: socket, Command: "go test", BulkBytes: 64 << 10, MaxBytes: 1 << 20, Rounds: 2, Window: 5 * time.Millisecond, SmallOps: 20, Launches: 200,
		Tenants: []int{1, 2}, DLRM: tinyDLRM, NodeLinkBytes: 2 << 20, Decoder: tinyDecoder,
		Progress: func(s string) { heard = append(heard, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Transfers) != 3 || r.Transfers[0].Bytes != 4<<10 || r.Transfers[2].Bytes != 1<<20 || r.Transfers[0].Reps < 1 {
		t.Fatalf("transfers %+v", r.Transfers)
	}
	for _, tr := range r.Transfers {
		if !(tr.MemcpyMBps > 0 && tr.RawTCPMBps > 0 && tr.H2DMBps > 0 && tr.D2HMBps > 0 && tr.H2DRatio > 0 && tr.D2HRatio > 0) ||
			tr.RawTCPStreams < 2 || !(tr.RawTCPParallelMBps > 0) || !(tr.H2DRatioMin <= tr.H2DRatio && tr.H2DRatio <= tr.H2DRatioMax) ||
			!(tr.BestRawMBps >= tr.RawTCPMBps && tr.BestRawMBps >= tr.RawTCPInprocMBps && tr.BestRawMBps >= tr.RawTCPParallelMBps) ||
			!(tr.H2DBestRatio > 0 && tr.D2HBestRatioMin <= tr.D2HBestRatio && tr.D2HBestRatio <= tr.D2HBestRatioMax) {
			t.Errorf("transfer %+v", tr)
		}
	}
	if !r.HostAlloc || r.BulkBytes != 64<<10 || r.H2DRatio != r.Transfers[1].H2DRatio || r.D2HRatio != r.Transfers[1].D2HRatio || !(r.MemcpyMBps > 0) {
		t.Errorf("headline %+v", r)
	}
	if !(r.SmallOpUs > 0 && r.RawPingPongUs > 0 && r.SmallOpRatio > 0 && r.LaunchesPerS > 0 && r.LaunchPingPongRatio > 0) ||
		r.SmallOpSamples < 2*20 || r.Launches < 2*200 || !(r.SmallOpRatioMin <= r.SmallOpRatio && r.SmallOpRatio <= r.SmallOpRatioMax) {
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
	if steps := (Options{BulkBytes: 64 << 10, MaxBytes: 1 << 20, Tenants: []int{1, 2}, NodeLinkBytes: 2 << 20, Decoder: tinyDecoder}).Steps(); len(heard) != steps {
		t.Errorf("progress heard %d steps, Steps says %d: %q", len(heard), steps, heard)
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
	for _, k := range []string{"h2d_ratio", "d2h_ratio", "small_op_ratio", "launches_per_s", "h2d_ratio_min", "d2h_ratio_max", "h2d_best_ratio",
		"d2h_best_ratio_min", "best_raw_mb_per_s", "small_op_ratio_max", "launch_ping_pong_ratio", "node_tls_ratio_min", "window_s", "node_tls_ratio", "hint_bytes_ratio", "dlrm_2_tenants_bytes_ratio",
		"decode_round_trips_per_step", "decode_step_graph_vs_ops_ratio", "decode_command_bytes_graph_vs_ops_ratio", "decode_p99_under_prefill_flood_ratio"} {
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
	socket := systest.Start(t, 1, 32<<20)
	sh := tinyDLRM
	sh.Defaults(1 << 30)
	m := models.NewDLRM(sh, 1)
	m.Batches[1].Want[3] += 0.5
	_, err := runDLRM(socket, m, 1, false)
	if !errors.Is(err, api.ErrInternal) || !strings.Contains(err.Error(), "batch 1") {
		t.Fatalf("err %v, want a mismatch of batch 1", err)
	}
}

func TestRunRejectsBadOptionsFirst(t *testing.T) {
	for _, o := range []Options{
		{Tenants: []int{2, 0}},
		{Decoder: DecoderOptions{Prompt: 200}},
		{Decoder: DecoderOptions{Steps: 1}},
		{Decoder: DecoderOptions{Prompt: 100, Steps: 29}},
		{Decoder: DecoderOptions{FloodSteps: 3}},
		{Decoder: DecoderOptions{Model: models.GPTConfig{Vocab: 8, DModel: 6, Heads: 4, Layers: 1, Context: 8}}},
	} {
		o.Socket = "/nonexistent"
		if _, err := Run(o); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%+v: err %v", o.Decoder, err)
		}
	}
}

// The decoder part at tiny sizes on a node of two devices: every figure
// measured, both ways checked against the reference at every step, the
// graph's decode step one request, no KV cache bytes over the network,
// and the decoding and the flooding sessions on one device.
func TestDecoderPart(t *testing.T) {
	socket := systest.Start(t, 2, 128<<20)
	r, err := decoder(socket, tinyDecoder, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *r)
	if r.RoundTrips != 1 || !(r.OpsRoundTrips >= 2) {
		t.Errorf("round trips per step: graph %v, op by op %v", r.RoundTrips, r.OpsRoundTrips)
	}
	if !(r.StepRatio > 0) || len(r.StepRatios) != 2 || !(r.CommandBytesRatio > 0 && r.CommandBytesRatio < 1) {
		t.Errorf("ratios: step %v %v, bytes %v", r.StepRatio, r.StepRatios, r.CommandBytesRatio)
	}
	if r.KVBytesOverNetwork != 0 || !(r.GraphNodeBytes > 0) || r.GraphNodeBytes >= float64(r.KVBytesPerToken) {
		t.Errorf("graph node bytes per step %v (early %v, late %v), KV per token %d: over the network %v",
			r.GraphNodeBytes, r.NodeBytesEarly, r.NodeBytesLate, r.KVBytesPerToken, r.KVBytesOverNetwork)
	}
	if len(r.Flood) != 2 || !r.Flood[0].Phases || r.Flood[1].Phases || !(r.FloodRatio > 0 && r.FloodNoPhasesRatio > 0) || r.Flood[0].FloodPrefills == 0 ||
		!(r.Flood[0].PeriodUs > 0 && r.Flood[0].AloneP50Us > 0) || r.Flood[0].Device == "" {
		t.Errorf("flood %+v", r.Flood)
	}
	// The node's scheduler saw both tenants' work on the same devices.
	st, err := operatorStatus(socket)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string][]uint32{}
	for _, sh := range st.Nodes[0].Shares {
		if sh.DeviceTime > 0 {
			used[sh.Tenant] = append(used[sh.Tenant], sh.Device)
		}
	}
	if v, p := used["decode-victim"], used["prefill-flood"]; len(v) == 0 || !slices.Equal(v, p) {
		t.Errorf("devices used: decoding tenant %v, flooding tenant %v, want the same", v, p)
	}
	// The model's weights, 0.1 MiB packed into one frame, are sent once
	// with hints (the later tenants' frame named by its hash), by every
	// tenant without.
	without, with := r.Load[0], r.Load[1]
	if !(r.LoadSentNoHintsRatio >= 3) || !(r.LoadSentRatio >= 1 && r.LoadSentRatio < 1.05) || with.DedupBytes != 2*(2<<20) || !(r.LoadHintRatio > 2.8) {
		t.Errorf("load without hints %+v, with %+v: copies sent %v and %v, ratio %v", without, with, r.LoadSentNoHintsRatio, r.LoadSentRatio, r.LoadHintRatio)
	}
}
