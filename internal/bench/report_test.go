package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/internal/models"
)

// bulk1M is the 1 MiB size's spread in sampleReport: the parallel
// streams were the best raw transport.
var bulk1M = BulkSpread{H2DRatioMin: 0.85, H2DRatioMax: 0.95, D2HRatioMin: 0.7, D2HRatioMax: 0.9, RawTCPParallelMBps: 3600, RawTCPStreams: 2,
	BestRaw: "tcp_parallel", BestRawMBps: 3600, H2DBestRatio: 0.75, H2DBestRatioMin: 0.7, H2DBestRatioMax: 0.8, D2HBestRatio: 0.67, D2HBestRatioMin: 0.6, D2HBestRatioMax: 0.7}

// sampleReport is a report as a run of two sizes and two tenant counts
// fills it.
func sampleReport() *Report {
	r := &Report{
		Command: "make bench", Date: "2026-12-01T00:00:00Z", CPUs: 2, GoOSArch: "linux/amd64", HostAlloc: true, Rounds: 5, WindowS: 0.5,
		BulkBytes: 1 << 20, MemcpyMBps: 9000, RawTCPMBps: 3000, H2DMBps: 2700, D2HMBps: 2400, H2DRatio: 0.9, D2HRatio: 0.8, BulkSpread: bulk1M,
		RawPingPongUs: 10, RawPingPongInprocUs: 5, SmallOpUs: 13, SmallOpRatio: 1.3, SmallOpInprocRatio: 2.6, SmallOpSamples: 100, LaunchesPerS: 250000, Launches: 1000,
		SmallOpRatioMin: 1.2, SmallOpRatioMax: 1.4, SmallOpInprocRatioMin: 2.5, SmallOpInprocRatioMax: 2.7, LaunchesPerSMin: 240000, LaunchesPerSMax: 260000,
		LaunchPingPongRatio: 2.5, LaunchPingPongRatioMin: 2.4, LaunchPingPongRatioMax: 2.6,
		HintBytesRatio: 1.9,
		Transfers: []Transfer{
			{Bytes: 4 << 10, Reps: 4096, MemcpyMBps: 20000, RawTCPMBps: 1500, RawTCPInprocMBps: 1400, H2DMBps: 300, D2HMBps: 280, H2DRatio: 0.2, D2HRatio: 0.19,
				BulkSpread: BulkSpread{H2DRatioMin: 0.15, H2DRatioMax: 0.25, D2HRatioMin: 0.18, D2HRatioMax: 0.2, RawTCPParallelMBps: 1200, RawTCPStreams: 2,
					BestRaw: "tcp", BestRawMBps: 1500, H2DBestRatio: 0.2, H2DBestRatioMin: 0.15, H2DBestRatioMax: 0.25, D2HBestRatio: 0.19, D2HBestRatioMin: 0.18, D2HBestRatioMax: 0.2}},
			{Bytes: 1 << 20, Reps: 64, MemcpyMBps: 9000, RawTCPMBps: 3000, H2DMBps: 2700, D2HMBps: 2400, H2DRatio: 0.9, D2HRatio: 0.8, BulkSpread: bulk1M},
		},
		DLRMModel: DLRMShape{TableBytes: 64 << 20, Dim: 64, Batch: 128, Pooling: 32, Hidden: 256, Out: 64, Steps: 32},
		DLRM: []DLRMRun{
			{Tenants: 1, LoadBytes: 64 << 20, StepBytes: 1 << 20, LoadS: 0.1, Steps: 32, StepsPerS: 100, ReloadBytes: 64 << 20},
			{Tenants: 1, Hints: true, LoadBytes: 64 << 20, StepBytes: 1 << 20, LoadS: 0.1, Steps: 32, StepsPerS: 100, BytesRatio: 1, ReloadBytes: 1 << 20, ReloadRatio: 64},
			{Tenants: 2, LoadBytes: 128 << 20, StepBytes: 2 << 20, LoadS: 0.2, Steps: 64, StepsPerS: 150, ReloadBytes: 64 << 20},
			{Tenants: 2, Hints: true, LoadBytes: 66 << 20, StepBytes: 2 << 20, DedupBytes: 64 << 20, LoadS: 0.1, Steps: 64, StepsPerS: 150, BytesRatio: 1.9, ReloadBytes: 1 << 20, ReloadRatio: 64},
		},
		NodeLinkReport: &NodeLinkReport{Bytes: 64 << 20, PlainMBps: 2000, TLSMBps: 900, Ratio: 0.45, RatioMin: 0.4, RatioMax: 0.5},
		DecoderReport: &DecoderReport{
			Model: models.SmallGPT, Prompt: 16, Rounds: 2, Steps: 128, GraphStepUs: 600, OpsStepUs: 1000, StepRatio: 0.6, StepRatios: []float64{0.55, 0.65}, StepRatioMin: 0.55, StepRatioMax: 0.65,
			RoundTrips: 1, OpsRoundTrips: 2, GraphTenantBytes: 56, GraphNodeBytes: 170, OpsTenantBytes: 4600, OpsNodeBytes: 6200, CommandBytesRatio: 0.021,
			KVBytesPerToken: 2048, NodeBytesEarly: 170, NodeBytesLate: 170,
			Flood: []FloodRun{
				{Phases: true, Steps: 400, PeriodUs: 1800, AloneP50Us: 600, AloneP99Us: 900, FloodP50Us: 650, FloodP99Us: 1200, Ratio: 1.33, FloodPrefills: 30},
				{Steps: 400, PeriodUs: 1800, AloneP50Us: 600, AloneP99Us: 900, FloodP50Us: 2000, FloodP99Us: 9000, Ratio: 10, FloodPrefills: 40},
			},
			FloodRatio: 1.33, FloodNoPhasesRatio: 10,
			Load: []DecoderLoad{
				{Model: models.SmallGPT, Tenants: 8, WeightBytes: 2 << 20, SentBytes: 16 << 20},
				{Model: models.SmallGPT, Tenants: 8, Hints: true, WeightBytes: 2 << 20, SentBytes: 2 << 20, DedupBytes: 14 << 20},
			},
			LoadSentRatio: 1, LoadSentNoHintsRatio: 8, LoadHintRatio: 8,
		},
	}
	return r
}

func TestJSONKeys(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	for _, k := range []string{
		"h2d_ratio", "d2h_ratio", "small_op_ratio", "node_tls_ratio", "hint_bytes_ratio",
		"dlrm_1_tenants_bytes_ratio", "dlrm_2_tenants_bytes_ratio", "dlrm_1_tenants_reload_ratio", "dlrm_2_tenants_reload_ratio",
		"launches_per_s", "memcpy_mb_per_s", "raw_tcp_mb_per_s", "raw_ping_pong_us", "bulk_bytes",
		"h2d_ratio_min", "h2d_ratio_max", "d2h_ratio_min", "d2h_ratio_max", "raw_tcp_parallel_mb_per_s", "raw_tcp_streams", "best_raw_mb_per_s",
		"h2d_best_ratio", "h2d_best_ratio_min", "h2d_best_ratio_max", "d2h_best_ratio", "d2h_best_ratio_min", "d2h_best_ratio_max",
		"small_op_ratio_min", "small_op_ratio_max", "small_op_inproc_ratio_min", "small_op_inproc_ratio_max", "launches_per_s_min", "launches_per_s_max",
		"launch_ping_pong_ratio", "launch_ping_pong_ratio_min", "launch_ping_pong_ratio_max", "node_tls_ratio_min", "node_tls_ratio_max",
		"decode_step_graph_vs_ops_ratio_min", "decode_step_graph_vs_ops_ratio_max", "window_s",
		"decode_round_trips_per_step", "decode_step_graph_vs_ops_ratio", "decode_command_bytes_graph_vs_ops_ratio",
		"decode_p99_under_prefill_flood_ratio", "decode_p99_under_prefill_flood_no_phases_ratio", "kv_cache_bytes_per_token",
		"decoder_load_sent_over_weight_bytes_ratio", "decoder_load_sent_over_weight_bytes_no_hints_ratio", "decoder_load_bytes_without_over_with_hints_ratio",
	} {
		if v, ok := m[k].(float64); !ok || !(v > 0) {
			t.Errorf("%s = %v, want a positive number", k, m[k])
		}
	}
	if v, ok := m["kv_cache_bytes_over_network_per_step"]; v != 0.0 || !ok {
		t.Errorf("kv_cache_bytes_over_network_per_step = %v", v)
	}
	if m["dlrm_2_tenants_bytes_ratio"] != 1.9 || m["command"] != "make bench" {
		t.Errorf("dlrm_2_tenants_bytes_ratio %v, command %v", m["dlrm_2_tenants_bytes_ratio"], m["command"])
	}
	// Every ratio of the system to a baseline is under a key ending in
	// _ratio, at the top and in the arrays, its range beside it; and the
	// range holds the median.
	for k := range m {
		if strings.Contains(k, "ratio") && !strings.HasSuffix(k, "_ratio") && !strings.HasSuffix(k, "_ratio_min") && !strings.HasSuffix(k, "_ratio_max") {
			t.Errorf("key %s holds a ratio but does not end in _ratio", k)
		}
		if base, ok := strings.CutSuffix(k, "_ratio_min"); ok {
			lo, med, hi := m[k].(float64), m[base+"_ratio"].(float64), m[base+"_ratio_max"].(float64)
			if !(lo <= med && med <= hi) {
				t.Errorf("%s_ratio %v outside [%v, %v]", base, med, lo, hi)
			}
		}
	}
	if m["best_raw"] != "tcp_parallel" {
		t.Errorf("best_raw = %v", m["best_raw"])
	}
	ts, _ := m["transfers"].([]any)
	if len(ts) != 2 {
		t.Fatalf("transfers = %v", m["transfers"])
	}
	for _, e := range ts {
		tr := e.(map[string]any)
		for _, k := range []string{"bytes", "reps", "memcpy_mb_per_s", "raw_tcp_mb_per_s", "h2d_mb_per_s", "d2h_mb_per_s", "h2d_ratio", "d2h_ratio",
			"h2d_ratio_min", "d2h_ratio_max", "raw_tcp_parallel_mb_per_s", "best_raw_mb_per_s", "h2d_best_ratio", "d2h_best_ratio_min"} {
			if v, ok := tr[k].(float64); !ok || !(v > 0) {
				t.Errorf("transfers: %s = %v", k, tr[k])
			}
		}
	}
	ds, _ := m["dlrm"].([]any)
	if len(ds) != 4 {
		t.Fatalf("dlrm = %v", m["dlrm"])
	}
	d := ds[3].(map[string]any)
	if d["tenants"] != 2.0 || d["hints"] != true || d["load_bytes"] != float64(66<<20) || d["step_bytes"] != float64(2<<20) ||
		d["steps_per_s"] != 150.0 || d["bytes_ratio"] != 1.9 {
		t.Errorf("dlrm[3] = %v", d)
	}
	if _, ok := ds[0].(map[string]any)["bytes_ratio"]; ok {
		t.Errorf("a run without hints has a bytes_ratio: %v", ds[0])
	}
}

// Without DLRM or node link the JSON has neither their keys nor broken
// syntax.
func TestJSONWithoutOptionalParts(t *testing.T) {
	r := sampleReport()
	r.DLRM, r.NodeLinkReport, r.DecoderReport, r.HintBytesRatio = nil, nil, nil, 0
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	for k := range m {
		if strings.HasPrefix(k, "dlrm_") && k != "dlrm_model" || strings.HasPrefix(k, "node_") || strings.HasPrefix(k, "decode") || strings.HasPrefix(k, "kv_") {
			t.Errorf("unexpected key %s", k)
		}
	}
}

func TestMarkdownTables(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteMarkdown(&b, "bench.svg"); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	lines := strings.Split(md, "\n")
	if !strings.Contains(strings.Join(lines[:4], "\n"), "`make bench`") {
		t.Errorf("the command is not at the top:\n%s", md)
	}
	for _, want := range []string{
		"![", "(bench.svg)",
		"5 interleaved rounds", "windows of at least 500ms",
		"## Host↔device copies", "| 4.0 KiB | 4096 | 20000 MB/s | 1500 MB/s | 1400 MB/s | 1200 MB/s (2 streams) | 300 MB/s | **0.20** [0.15–0.25] | 0.20 [0.15–0.25] (tcp) " +
			"| 280 MB/s | **0.19** [0.18–0.20] | 0.19 [0.18–0.20] |",
		"| 0.75 [0.70–0.80] (tcp_parallel) |",
		"## Small operations", "| **1.30** [1.20–1.40] |", "250000 /s [240000–260000] | 100000 round trips/s", "| 2.5 [2.4–2.6] launches per round trip |",
		"## DLRM-style inference", "| 2 | yes | 66.0 MiB | 2.0 MiB | 64.0 MiB | 0.10 s | 150.0 | **1.90** |",
		"## Mutual TLS on the node link", "| 2000 MB/s | 900 MB/s | **0.45** [0.40–0.50] |",
		"## GPT-style decoder", "| time (median) | 600 µs | 1000 µs | **0.60** (rounds: 0.55, 0.65) |",
		"| bytes, both | 226 | 10800 | **0.021** |", "**0** cache bytes over the network per step",
		"| true | 400 | 1800 µs | 600 / 900 µs | 650 / 1200 µs | 30 | **1.33** |",
		"| 2 layers × d_model 128, vocabulary 512 | 8 | true | 2.0 MiB | 2.0 MiB | 14.0 MiB | **1.00** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Every table row has as many cells as its header.
	cells := 0
	for _, l := range lines {
		if !strings.HasPrefix(l, "|") {
			cells = 0
			continue
		}
		n := strings.Count(l, "|")
		if cells == 0 {
			cells = n
		} else if n != cells {
			t.Errorf("row %q has %d separators, its table %d", l, n, cells)
		}
	}
}

// parseSVG checks that b is well-formed XML with an svg root and returns
// its text.
func parseSVG(t *testing.T, b []byte) string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var root string
	var text strings.Builder
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v\n%s", err, b)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
				if tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root namespace %q", tok.Name.Space)
				}
			}
		case xml.CharData:
			text.Write(tok)
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return text.String()
}

func TestSVGParses(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	text := parseSVG(t, b.Bytes())
	for _, want := range []string{"host→device", "device→host", "4.0 KiB", "1.0 MiB", "2 tenants", "with hints", "without / with: 1.90",
		"host→device 4.0 KiB: 0.20 (rounds 0.15–0.25)", "device→host / best raw 1.0 MiB: 0.67 (rounds 0.60–0.70)"} {
		if !strings.Contains(text, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if n := strings.Count(b.String(), "<rect "); n != 1+4+4 { // background, 4 bars, 4 legend boxes
		t.Errorf("%d rects", n)
	}
	// A whisker per series and size: 4 series, 2 sizes.
	if n := strings.Count(b.String(), `stroke-width="1.5"`); n != 4*2 {
		t.Errorf("%d whiskers, want 8", n)
	}
	// An empty report still draws a valid chart.
	b.Reset()
	if err := (&Report{}).WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	parseSVG(t, b.Bytes())
}

func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	r := sampleReport()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, JSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	r.WriteJSON(&want)
	if !bytes.Equal(js, want.Bytes()) {
		t.Errorf("%s differs from WriteJSON", JSONFile)
	}
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	if err != nil || !strings.Contains(string(md), "("+SVGFile+")") {
		t.Errorf("%s: %v, does not show the chart", MarkdownFile, err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, SVGFile))
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, svg)
}

func TestSizesFor(t *testing.T) {
	for _, c := range []struct {
		max, headline int
		want          []int
	}{
		{1 << 30, 256 << 20, DefaultSizes},
		{8 << 20, 8 << 20, []int{4 << 10, 64 << 10, 1 << 20, 8 << 20}},
		{1 << 20, 64 << 10, []int{4 << 10, 64 << 10, 1 << 20}},
		{64 << 20, 3 << 20, []int{4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20, 64 << 20}},
		{1 << 10, 1 << 10, []int{1 << 10}},
	} {
		if got := sizesFor(c.max, c.headline); !slices.Equal(got, c.want) {
			t.Errorf("sizesFor(%d, %d) = %v, want %v", c.max, c.headline, got, c.want)
		}
	}
}

func TestNiceMax(t *testing.T) {
	for _, c := range []struct{ v, top, step float64 }{
		{0.93, 1, 0.2}, {1.1, 1.25, 0.25}, {1.63, 2, 0.5}, {3, 3, 1}, {598, 600, 200}, {1000, 1000, 200}, {0, 1, 0.25},
	} {
		if top, step := niceMax(c.v); top != c.top || step != c.step {
			t.Errorf("niceMax(%g) = %g, %g; want %g, %g", c.v, top, step, c.top, c.step)
		}
	}
}

func TestRawStreamDeliversEveryByte(t *testing.T) {
	l, err := dialTCPLink()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, size := range []int{4 << 10, 3<<20 + 5} {
		src, dst := make([]byte, size), make([]byte, size)
		fillPattern(src)
		d, err := l.stream(dst, src, 3)
		if err != nil || d <= 0 {
			t.Fatalf("%d bytes: %v, %v", size, d, err)
		}
		if i := firstDiff(dst, src); i >= 0 {
			t.Fatalf("%d bytes: differ at %d", size, i)
		}
	}
	if _, err := l.stream(make([]byte, 1), make([]byte, 2), 1); err == nil {
		t.Fatal("destination of another size accepted")
	}
}

func TestFirstDiff(t *testing.T) {
	a := make([]byte, 200<<10)
	fillPattern(a)
	b := slices.Clone(a)
	if i := firstDiff(a, b); i != -1 {
		t.Fatalf("equal: %d", i)
	}
	b[150<<10+3] ^= 1
	if i := firstDiff(a, b); i != 150<<10+3 {
		t.Fatalf("differ at %d, want %d", i, 150<<10+3)
	}
	// The pattern differs in every word, so a shifted chunk shows.
	if firstDiff(a[8:1<<10+8], a[:1<<10]) != 0 {
		t.Fatal("pattern repeats within a kilobyte")
	}
}
