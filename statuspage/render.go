package statuspage

import (
	"bytes"
	"embed"
	"fmt"
	"hash/fnv"
	"html/template"
	"io"
	"math"
	"math/bits"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api"
)

//go:embed page.html
var pageFS embed.FS

// page holds two templates: "page", the whole document, and "live", the
// part of it that the page's script fetches again every interval and swaps
// in. The page is that part plus its frame, so both come from one
// rendering and can never disagree.
var page = template.Must(template.New("").Funcs(template.FuncMap{
	"size":     api.FormatSize,
	"pct":      percent,
	"retained": retainedBytes,
	"ctr":      containerName,
	"mul100":   func(v float64) float64 { return 100 * v },
	"gpus":     gpuRows,
}).ParseFS(pageFS, "page.html"))

// The charts' SVG coordinate space; the page scales it to its width.
const chartW, chartH = 600.0, 150.0

// palette colours a chart's lines; a series keeps its colour from one
// refresh to the next (it is chosen by a hash of its name, not its rank).
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

// view is what the templates render.
type view struct {
	Snapshot
	Sampled       string // Snapshot.Time, as a clock time
	RefreshMillis int64
	Charts        []chart
}

// chart is one line chart over the history window.
type chart struct {
	Title string
	ID    string
	Top   string // the value at the top of the y axis, formatted
	Mid   string // and at half of it
	Span  string // the window, as "-5m"
	Lines []line
}

// line is one series of a chart.
type line struct {
	Name   string
	Color  string
	Points string // SVG polyline points in chartW × chartH
	Last   string // the newest value, formatted
}

// render writes template name ("page" or "live") for snap and the history
// hist, with the window of the charts and the refresh interval. It renders
// into a buffer first, so a failure writes nothing rather than half a page.
func render(w io.Writer, name string, snap Snapshot, hist []Sample, window, refresh time.Duration) error {
	v := view{Snapshot: snap, Sampled: snap.Time.Format("15:04:05"), RefreshMillis: refresh.Milliseconds(), Charts: charts(hist, snap.Time, window)}
	var b bytes.Buffer
	if err := page.ExecuteTemplate(&b, name, v); err != nil {
		return fmt.Errorf("render %s: %v: %w", name, err, api.ErrInternal)
	}
	_, err := b.WriteTo(w)
	return err
}

// charts builds the page's charts from the samples of the window ending at
// now: memory per tenant, memory used per device, device time per tenant,
// launches per second.
func charts(hist []Sample, now time.Time, window time.Duration) []chart {
	bytesOf := func(m func(Sample) map[string]uint64) func(Sample, string) float64 {
		return func(s Sample, k string) float64 { return float64(m(s)[k]) }
	}
	tenantMem := func(s Sample) map[string]uint64 { return s.TenantMemory }
	deviceMem := func(s Sample) map[string]uint64 { return s.DeviceUsed }
	formatBytes := func(v float64) string { return api.FormatSize(uint64(v)) }
	formatRate := func(v float64) string { return fmt.Sprintf("%.3g/s", v) }
	formatPercent := func(v float64) string { return fmt.Sprintf("%.0f%%", v) }
	busy := func(s Sample) map[string]float64 { return s.Busy }
	return []chart{
		lineChart("Memory allocated per tenant", "chart-tenant-memory", hist, seriesNames(hist, tenantMem), bytesOf(tenantMem), ceilPow2, formatBytes, now, window),
		lineChart("Memory used per device", "chart-device-memory", hist, seriesNames(hist, deviceMem), bytesOf(deviceMem), ceilPow2, formatBytes, now, window),
		lineChart("Device time per tenant, all devices (100%: one device's time)", "chart-device-time", hist, seriesNames(hist, busy),
			func(s Sample, k string) float64 { return 100 * s.Busy[k] }, ceil125, formatPercent, now, window),
		lineChart("Kernel launches per second, all devices", "chart-launches", hist, []string{"launches"},
			func(s Sample, _ string) float64 { return s.LaunchRate }, ceil125, formatRate, now, window),
	}
}

// lineChart plots value for each name over the samples inside the window
// ending at now. Until the samples span the window (a mediator that
// started a minute ago) the x axis spans the samples, so that they fill
// the chart. A name missing from a sample counts as 0 there (a tenant
// whose sessions ended holds nothing). The y axis runs from 0 to ceil of
// the largest value, so a flat line at 0 is at the bottom, not the middle.
func lineChart(title, id string, hist []Sample, names []string, value func(Sample, string) float64,
	ceil func(float64) float64, format func(float64) string, now time.Time, window time.Duration) chart {
	start := now.Add(-window)
	var in []Sample
	for _, s := range hist {
		if !s.Time.Before(start) && !s.Time.After(now) {
			in = append(in, s)
		}
	}
	if len(in) > 1 && in[0].Time.After(start) {
		start = in[0].Time
		window = now.Sub(start)
	}
	top := 0.0
	for _, s := range in {
		for _, n := range names {
			top = math.Max(top, value(s, n))
		}
	}
	top = ceil(top)
	c := chart{Title: title, ID: id, Top: format(top), Mid: format(top / 2), Span: "-" + shortDuration(window)}
	for _, n := range names {
		pts := make([]string, len(in))
		for i, s := range in {
			x := chartW * s.Time.Sub(start).Seconds() / window.Seconds()
			y := chartH - chartH*value(s, n)/top
			pts[i] = fmt.Sprintf("%.1f,%.1f", x, y)
		}
		l := line{Name: n, Color: colour(n), Points: strings.Join(pts, " ")}
		if len(in) > 0 {
			l.Last = format(value(in[len(in)-1], n))
		}
		c.Lines = append(c.Lines, l)
	}
	return c
}

// colour picks a series' colour from its name.
func colour(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return palette[h.Sum32()%uint32(len(palette))]
}

// ceilPow2 is the least power of two at or above v (1 for v ≤ 1): byte
// axes then end at 64 MiB or 1 GiB rather than 95.4 MiB.
func ceilPow2(v float64) float64 {
	if v <= 1 {
		return 1
	}
	if v >= 1<<62 {
		return v
	}
	return float64(uint64(1) << bits.Len64(uint64(math.Ceil(v))-1))
}

// ceil125 is the least of 1, 2 or 5 times a power of ten at or above v (1
// for v ≤ 1).
func ceil125(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// shortDuration writes d as "5m", "90s" or "1h".
func shortDuration(d time.Duration) string {
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	default:
		return fmt.Sprintf("%ds", int64(d.Round(time.Second)/time.Second))
	}
}

// percent is part of whole in percent, 0 when whole is 0, for bar widths.
func percent(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return math.Min(100, 100*float64(part)/float64(whole))
}

// retainedBytes is the memory of a device's retained frames, as vgpuctl
// status counts it.
func retainedBytes(d api.DeviceStatus) uint64 {
	if d.Frames == 0 {
		return 0
	}
	return d.Memory / uint64(d.Frames) * uint64(d.Retained)
}

// gpuRow is a row of the page's GPU table: a cuda device's GPU as NVML
// read it for the status, formatted as vgpuctl status shows it.
type gpuRow struct {
	Node, Name                   string
	Device                       uint32
	GPU                          *api.GPUStatus
	Util, Used, Temp, Power, ECC string
}

// gpuRows are the GPUs behind the devices of st's nodes; none on sim.
func gpuRows(st *api.Status) []gpuRow {
	var rows []gpuRow
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if g := d.GPU; g != nil {
				r := gpuRow{Node: n.Addr, Name: d.Name, Device: d.Index, GPU: g}
				r.Util, r.Used, r.Temp, r.Power, r.ECC = g.Readings(func(n uint64) string { return fmt.Sprint(n) })
				rows = append(rows, r)
			}
		}
	}
	return rows
}

// containerName is a container as vgpuctl status shows it: "namespace/id"
// with the id cut to 12 characters, "-" for none (a host session).
func containerName(namespace, id string) string {
	if id == "" {
		return "-"
	}
	if len(id) > 12 {
		id = id[:12]
	}
	if namespace != "" {
		return namespace + "/" + id
	}
	return id
}
