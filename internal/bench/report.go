package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Files are the names WriteFiles gives the report in its directory.
const (
	JSONFile     = "bench.json"
	MarkdownFile = "bench.md"
	SVGFile      = "bench.svg"
)

// MarshalJSON writes the report's fields, then two keys per DLRM tenant
// count: dlrm_<T>_tenants_bytes_ratio, bytes moved without hints over with
// them, and dlrm_<T>_tenants_reload_ratio, the same for the reload after
// the run.
func (r *Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	b, err := json.Marshal((*plain)(r))
	if err != nil {
		return nil, err
	}
	var extra bytes.Buffer
	for _, d := range r.DLRM {
		if d.Hints {
			fmt.Fprintf(&extra, `,"dlrm_%d_tenants_bytes_ratio":%s,"dlrm_%d_tenants_reload_ratio":%s`, d.Tenants,
				strconv.FormatFloat(d.BytesRatio, 'g', -1, 64), d.Tenants, strconv.FormatFloat(d.ReloadRatio, 'g', -1, 64))
		}
	}
	if extra.Len() == 0 {
		return b, nil
	}
	b = b[:len(b)-1] // the closing brace
	b = append(b, extra.Bytes()...)
	return append(b, '}'), nil
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteFiles writes the report to dir (created if missing) as JSONFile,
// MarkdownFile and SVGFile; the markdown shows the chart.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{JSONFile, r.WriteJSON}, {MarkdownFile, func(w io.Writer) error { return r.WriteMarkdown(w, SVGFile) }}, {SVGFile, r.WriteSVG}} {
		var b bytes.Buffer
		if err := f.write(&b); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WriteMarkdown writes one table per section, the command that produced
// them at the top; chart, if not empty, is the SVG to show under it.
func (r *Report) WriteMarkdown(w io.Writer, chart string) error {
	var b bytes.Buffer
	host := "shared with the mediator (`client.HostAlloc`, like pinned memory of a GPU driver)"
	if !r.HostAlloc {
		host = "ordinary Go memory (pageable)"
	}
	fmt.Fprintf(&b, "# Data-path benchmark\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s, %d CPUs (%s). Every figure beside its baseline from the same run; "+
		"a ratio is the system over its baseline. Timed figures are taken in %d interleaved rounds, the system and its baselines "+
		"taking turns, each in windows of at least %s of work cut into %d slices that alternate with the other figures' slices; "+
		"a figure is the median of the rounds, a ratio the median of the "+
		"rounds' ratios, with their range [min–max].\n\n", r.Command, r.Date, r.CPUs, r.GoOSArch, r.Rounds, time.Duration(r.WindowS*float64(time.Second)), max(1, r.Slices))
	if chart != "" {
		fmt.Fprintf(&b, "![host↔device ratios per size; DLRM bytes moved with and without hints](%s)\n\n", chart)
	}

	fmt.Fprintf(&b, "## Host↔device copies\n\n")
	fmt.Fprintf(&b, "`%s`: copies between host memory %s and device memory, against memcpy and a raw loopback TCP stream "+
		"of the same bytes to a receiver process (written in %s chunks, read with plain reads into a destination of the transfer's size); "+
		"the ratios are to that stream. The same stream to a receiver goroutine of the benchmarking process, and the same bytes "+
		"split over several streams to receiver processes of their own, are measured too: the fastest of the three is the best raw "+
		"transport, the second baseline (memcpy is not one: the bytes must reach the node through a socket). "+
		"A window is back-to-back copies and one synchronize. Every device→host window's bytes are compared with what was copied in.\n\n",
		r.Command, host, api.FormatSize(wire.MaxChunk))
	fmt.Fprintf(&b, "| size | copies per window | memcpy | raw TCP stream | (in process) | (parallel) | host→device | **h2d ratio** | h2d / best raw | device→host | **d2h ratio** | d2h / best raw |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range r.Transfers {
		fmt.Fprintf(&b, "| %s | %d | %.0f MB/s | %.0f MB/s | %.0f MB/s | %.0f MB/s (%d streams) | %.0f MB/s | **%.2f** [%.2f–%.2f] | %.2f [%.2f–%.2f] (%s) "+
			"| %.0f MB/s | **%.2f** [%.2f–%.2f] | %.2f [%.2f–%.2f] |\n",
			api.FormatSize(uint64(t.Bytes)), t.Reps, t.MemcpyMBps, t.RawTCPMBps, t.RawTCPInprocMBps, t.RawTCPParallelMBps, t.RawTCPStreams,
			t.H2DMBps, t.H2DRatio, t.H2DRatioMin, t.H2DRatioMax, t.H2DBestRatio, t.H2DBestRatioMin, t.H2DBestRatioMax, t.BestRaw,
			t.D2HMBps, t.D2HRatio, t.D2HRatioMin, t.D2HRatioMax, t.D2HBestRatio, t.D2HBestRatioMin, t.D2HBestRatioMax)
	}

	fmt.Fprintf(&b, "\n## Small operations\n\n")
	fmt.Fprintf(&b, "`%s`: one session, one stream; the operation, the launches and both ping-pongs take turns in the same rounds.\n\n", r.Command)
	fmt.Fprintf(&b, "| measure | vgpu | baseline | ratio |\n|---|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| 4-byte device→host, synchronous (%d samples) | %.1f µs | %.1f µs (raw Unix+TCP ping-pong through relay and echo processes) | **%.2f** [%.2f–%.2f] |\n",
		r.SmallOpSamples, r.SmallOpUs, r.RawPingPongUs, r.SmallOpRatio, r.SmallOpRatioMin, r.SmallOpRatioMax)
	fmt.Fprintf(&b, "| the same | %.1f µs | %.1f µs (the ping-pong through goroutines of one process) | %.2f [%.2f–%.2f] |\n",
		r.SmallOpUs, r.RawPingPongInprocUs, r.SmallOpInprocRatio, r.SmallOpInprocRatioMin, r.SmallOpInprocRatioMax)
	fmt.Fprintf(&b, "| asynchronous launches of a tiny kernel (%d, checked) | %.0f /s [%.0f–%.0f] | %.0f round trips/s (the ping-pong through processes) "+
		"| %.1f [%.1f–%.1f] launches per round trip |\n", r.Launches, r.LaunchesPerS, r.LaunchesPerSMin, r.LaunchesPerSMax, 1e6/max(r.RawPingPongUs, 1e-9),
		r.LaunchPingPongRatio, r.LaunchPingPongRatioMin, r.LaunchPingPongRatioMax)

	if len(r.DLRM) > 0 {
		m := r.DLRMModel
		fmt.Fprintf(&b, "\n## DLRM-style inference, several tenants\n\n")
		fmt.Fprintf(&b, "`%s`: each tenant its own session, all serving the same model: a %s embedding table (%d-wide rows), "+
			"then layers of %d×%d and %d×%d (sgemm). A step pools %d bags of %d rows (embedding_bag_sum), runs both layers "+
			"and copies the outputs back; every output is checked against a pure-Go reference. The first tenant loads the "+
			"model, then the others at once; then all run %d steps at once. With hints the weights are allocated as "+
			"weights and sealed (a node that holds them already is not sent them again), the step buffers as staging "+
			"and activations. Bytes are what the mediator sent to and received from nodes for these sessions. Once every "+
			"session has ended, the first tenant comes back, as a restarted inference server does: it loads the model "+
			"again and runs one step (reload).\n\n",
			r.Command, api.FormatSize(uint64(m.TableBytes)), m.Dim, m.Dim, m.Hidden, m.Hidden, m.Out, m.Batch, m.Pooling, m.Steps)
		fmt.Fprintf(&b, "| tenants | hints | bytes moved: load | steps | not sent (dedup) | load time | steps/s (all tenants) | **bytes without / with hints** | reload | **reload without / with hints** |\n")
		fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, d := range r.DLRM {
			hints, ratio, reload := "no", "–", "–"
			if d.Hints {
				hints, ratio, reload = "yes", fmt.Sprintf("**%.2f**", d.BytesRatio), fmt.Sprintf("**%.0f**", d.ReloadRatio)
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %.2f s | %.1f | %s | %s | %s |\n", d.Tenants, hints, api.FormatSize(d.LoadBytes),
				api.FormatSize(d.StepBytes), api.FormatSize(d.DedupBytes), d.LoadS, d.StepsPerS, ratio, api.FormatSize(d.ReloadBytes), reload)
		}
	}

	if d := r.DecoderReport; d != nil {
		writeDecoder(&b, r.Command, d)
	}

	if nl := r.NodeLinkReport; nl != nil {
		fmt.Fprintf(&b, "\n## Mutual TLS on the node link\n\n")
		fmt.Fprintf(&b, "`%s`: an in-process sim node with a plain and a mutual-TLS listener; %s of pipelined node writes through each, "+
			"repeated to fill a window, taking turns in the rounds.\n\n", r.Command, api.FormatSize(uint64(nl.Bytes)))
		fmt.Fprintf(&b, "| plain TCP | mutual TLS | **TLS / plain** |\n|---:|---:|---:|\n")
		fmt.Fprintf(&b, "| %.0f MB/s | %.0f MB/s | **%.2f** [%.2f–%.2f] |\n", nl.PlainMBps, nl.TLSMBps, nl.Ratio, nl.RatioMin, nl.RatioMax)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// writeDecoder writes the decoder part's tables.
func writeDecoder(b *bytes.Buffer, command string, d *DecoderReport) {
	m := d.Model
	fmt.Fprintf(b, "\n## GPT-style decoder: registered graphs against op-by-op launches\n\n")
	fmt.Fprintf(b, "`%s`: a decoder of %d layers, d_model %d, %d heads, vocabulary %d, context %d (internal/models), "+
		"in two sessions: (a) registered prefill and decode graphs over sealed weights and KV caches; (b) the same kernels "+
		"launched one by one on a stream, weights uploaded once without hints. Both prefill a prompt of %d tokens, then decode "+
		"along the float64 reference's greedy path, every step's token checked; %d rounds of %d steps each, alternating "+
		"which way goes first. Bytes are those on the tenant's socket and on the mediator's node links, both ways.\n\n",
		command, m.Layers, m.DModel, m.Heads, m.Vocab, m.Context, d.Prompt, d.Rounds, d.Steps/max(1, d.Rounds))
	fmt.Fprintf(b, "| per decode step | (a) graph | (b) op by op | **(a) / (b)** |\n|---|---:|---:|---:|\n")
	spread := make([]string, len(d.StepRatios))
	for i, x := range d.StepRatios {
		spread[i] = fmt.Sprintf("%.2f", x)
	}
	fmt.Fprintf(b, "| time (median) | %.0f µs | %.0f µs | **%.2f** (rounds: %s) |\n", d.GraphStepUs, d.OpsStepUs, d.StepRatio, strings.Join(spread, ", "))
	fmt.Fprintf(b, "| requests on the tenant's socket | %.2f | %.2f | – |\n", d.RoundTrips, d.OpsRoundTrips)
	fmt.Fprintf(b, "| bytes, tenant's socket | %.0f | %.0f | – |\n", d.GraphTenantBytes, d.OpsTenantBytes)
	fmt.Fprintf(b, "| bytes, node links | %.0f | %.0f | – |\n", d.GraphNodeBytes, d.OpsNodeBytes)
	fmt.Fprintf(b, "| bytes, both | %.0f | %.0f | **%.3f** |\n", d.GraphTenantBytes+d.GraphNodeBytes, d.OpsTenantBytes+d.OpsNodeBytes, d.CommandBytesRatio)
	fmt.Fprintf(b, "\nKV cache: a token appends %s to the caches; the graph's decode steps moved %.0f B on the node links per step "+
		"in the first half of each round and %.0f B in the second (longer caches): **%.0f** cache bytes over the network per step.\n",
		api.FormatSize(d.KVBytesPerToken), d.NodeBytesEarly, d.NodeBytesLate, d.KVBytesOverNetwork)

	fmt.Fprintf(b, "\n### Decoding beside another tenant's prefills\n\n")
	fmt.Fprintf(b, "One session decodes (graph) at a steady pace, a step every three times its median step alone (a third of the "+
		"device, within its fair share of half), in windows alone and windows in which another session on the same device runs prefills of the "+
		"whole context back to back, alternating; its step time's p99 beside the flood over its p99 alone. Without phases, "+
		"both sessions' graphs are registered with phase other.\n\n")
	fmt.Fprintf(b, "| phases | steps | a step every | alone p50 / p99 | beside the flood p50 / p99 | prefills of the flood | **p99 ratio** |\n"+
		"|---|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range d.Flood {
		fmt.Fprintf(b, "| %v | %d | %.0f µs | %.0f / %.0f µs | %.0f / %.0f µs | %d | **%.2f** |\n", f.Phases, f.Steps, f.PeriodUs,
			f.AloneP50Us, f.AloneP99Us, f.FloodP50Us, f.FloodP99Us, f.FloodPrefills, f.Ratio)
	}

	fmt.Fprintf(b, "\n### Tenants loading one model\n\n")
	fmt.Fprintf(b, "Each tenant its own session; the first loads the model (the decoder's configuration, weights of another seed), "+
		"then the others at once, with hints as one sealed allocation of whole 2 MiB frames; bytes sent to the node meanwhile, "+
		"against one copy of the weights. Every tenant then runs a checked pass.\n\n")
	fmt.Fprintf(b, "| model | tenants | hints | weights (one copy) | sent to the node | not sent (dedup) | **sent / one copy** |\n|---|---:|---|---:|---:|---:|---:|\n")
	for _, l := range d.Load {
		fmt.Fprintf(b, "| %d layers × d_model %d, vocabulary %d | %d | %v | %s | %s | %s | **%.2f** |\n", l.Model.Layers, l.Model.DModel, l.Model.Vocab,
			l.Tenants, l.Hints, api.FormatSize(l.WeightBytes), api.FormatSize(l.SentBytes), api.FormatSize(l.DedupBytes),
			ratio(float64(l.SentBytes), float64(l.WeightBytes)))
	}
}
