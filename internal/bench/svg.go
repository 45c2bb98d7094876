package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/vgpu/vgpu/api"
)

// The chart: host↔device ratios per size on a logarithmic axis, each a
// median with a whisker from the lowest round to the highest, against the
// raw TCP stream (solid) and the best raw transport (dashed); and DLRM
// bytes moved without and with hints per tenant count, as one SVG drawn by
// hand (no dependency).

const (
	svgW      = 900
	panelH    = 360
	plotLeft  = 80
	plotRight = svgW - 30
	plotTop   = 60  // within a panel
	plotBot   = 300 // within a panel
)

var (
	colorH2D     = "#1f77b4"
	colorD2H     = "#ff7f0e"
	colorNoHints = "#9e9e9e"
	colorHints   = "#2ca02c"
)

type svg struct{ b bytes.Buffer }

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

func (s *svg) printf(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

func (s *svg) text(x, y float64, anchor, style, text string) {
	s.printf(`<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`+"\n", x, y, anchor, style, esc(text))
}

func (s *svg) line(x1, y1, x2, y2 float64, stroke string, extra string) {
	s.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" %s/>`+"\n", x1, y1, x2, y2, stroke, extra)
}

// niceMax returns a tick step of 1, 2, 2.5 or 5 times a power of ten
// that divides v into at most 5 parts, and the first multiple of it at or
// above v.
func niceMax(v float64) (top, step float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1, 0.25
	}
	raw := v / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * p
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	return math.Ceil(v/step-1e-9) * step, step
}

// legend draws colored boxes with labels from x at y.
func (s *svg) legend(x, y float64, items ...[2]string) {
	for _, it := range items {
		s.printf(`<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", x, y-10, it[0])
		s.text(x+16, y, "start", `font-size="12"`, it[1])
		x += 24 + 7*float64(len([]rune(it[1])))
	}
}

// WriteSVG draws the chart.
func (r *Report) WriteSVG(w io.Writer) error {
	var s svg
	s.printf(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	s.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n",
		svgW, 2*panelH, svgW, 2*panelH)
	s.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	s.ratios(r.Transfers, 0)
	s.dlrmBytes(r.DLRM, panelH)
	s.printf("</svg>\n")
	_, err := w.Write(s.b.Bytes())
	return err
}

// ratioSeries is one line of the ratio chart: a median per size and its
// range over the rounds.
type ratioSeries struct {
	name, color, dash string
	v                 func(Transfer) (median, lo, hi float64)
}

var ratioLines = []ratioSeries{
	{"host→device", colorH2D, "", func(t Transfer) (float64, float64, float64) { return t.H2DRatio, t.H2DRatioMin, t.H2DRatioMax }},
	{"device→host", colorD2H, "", func(t Transfer) (float64, float64, float64) { return t.D2HRatio, t.D2HRatioMin, t.D2HRatioMax }},
	{"host→device / best raw", colorH2D, "5 4", func(t Transfer) (float64, float64, float64) {
		return t.H2DBestRatio, t.H2DBestRatioMin, t.H2DBestRatioMax
	}},
	{"device→host / best raw", colorD2H, "5 4", func(t Transfer) (float64, float64, float64) {
		return t.D2HBestRatio, t.D2HBestRatioMin, t.D2HBestRatioMax
	}},
}

// ratios plots the h2d and d2h ratios against size, x logarithmic, each
// median with a whisker over its rounds' range.
func (s *svg) ratios(ts []Transfer, y0 float64) {
	s.text(svgW/2, y0+25, "middle", `font-size="16" font-weight="bold"`, "Host↔device throughput over raw transports of the same bytes (median, range of rounds)")
	top, bot := y0+plotTop, y0+plotBot
	if len(ts) == 0 {
		s.text(svgW/2, (top+bot)/2, "middle", `font-size="14"`, "no transfers measured")
		return
	}
	lo, hi := math.Log2(float64(ts[0].Bytes)), math.Log2(float64(ts[len(ts)-1].Bytes))
	if hi-lo < 1 {
		lo, hi = lo-1, hi+1
	}
	x := func(size int) float64 { return plotLeft + (math.Log2(float64(size))-lo)/(hi-lo)*(plotRight-plotLeft) }
	most := 1.0
	for _, t := range ts {
		for _, l := range ratioLines {
			m, _, hi := l.v(t)
			most = max(most, m, hi)
		}
	}
	ymax, step := niceMax(most * 1.1)
	y := func(v float64) float64 { return bot - v/ymax*(bot-top) }
	for v := 0.0; v <= ymax+step/2; v += step {
		s.line(plotLeft, y(v), plotRight, y(v), "#e0e0e0", "")
		s.text(plotLeft-8, y(v)+4, "end", `font-size="12"`, fmt.Sprintf("%g", math.Round(v*1000)/1000))
	}
	s.line(plotLeft, y(1), plotRight, y(1), "#444", `stroke-dasharray="6 4"`)
	s.text(plotLeft+6, y(1)-5, "start", `font-size="12" fill="#444"`, "baseline = 1")
	for _, t := range ts {
		s.line(x(t.Bytes), bot, x(t.Bytes), bot+5, "#444", "")
		s.text(x(t.Bytes), bot+20, "middle", `font-size="12"`, api.FormatSize(uint64(t.Bytes)))
	}
	s.line(plotLeft, bot, plotRight, bot, "#444", "")
	s.line(plotLeft, top, plotLeft, bot, "#444", "")
	s.text(svgW/2, bot+42, "middle", `font-size="13"`, "copy size (logarithmic)")
	s.printf(`<text x="%d" y="%.1f" text-anchor="middle" font-size="13" transform="rotate(-90 %d %.1f)">ratio to raw transport</text>`+"\n",
		25, (top+bot)/2, 25, (top+bot)/2)
	for k, series := range ratioLines {
		dash, width := "", 2
		if series.dash != "" {
			dash, width = fmt.Sprintf(` stroke-dasharray="%s"`, series.dash), 1
		}
		off := float64(k-len(ratioLines)/2) * 3 // whiskers of one size side by side
		pts := make([]string, len(ts))
		for i, t := range ts {
			m, _, _ := series.v(t)
			pts[i] = fmt.Sprintf("%.1f,%.1f", x(t.Bytes), y(m))
		}
		s.printf(`<polyline points="%s" fill="none" stroke="%s" stroke-width="%d"%s/>`+"\n", strings.Join(pts, " "), series.color, width, dash)
		for _, t := range ts {
			m, lo, hi := series.v(t)
			cx := x(t.Bytes) + off
			s.line(cx, y(lo), cx, y(hi), series.color, `stroke-width="1.5"`)
			s.line(cx-3, y(lo), cx+3, y(lo), series.color, "")
			s.line(cx-3, y(hi), cx+3, y(hi), series.color, "")
			fill := series.color
			if series.dash != "" {
				fill = "white"
			}
			s.printf(`<circle cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s"><title>%s</title></circle>`+"\n", x(t.Bytes), y(m), fill, series.color,
				esc(fmt.Sprintf("%s %s: %.2f (rounds %.2f–%.2f)", series.name, api.FormatSize(uint64(t.Bytes)), m, lo, hi)))
		}
	}
	s.legend(plotLeft+10, top-12, [2]string{colorH2D, "host→device / raw TCP (solid), / best raw (dashed)"},
		[2]string{colorD2H, "device→host / raw TCP (solid), / best raw (dashed)"})
}

// dlrmBytes draws grouped bars of bytes moved per tenant count, without
// and with hints.
func (s *svg) dlrmBytes(runs []DLRMRun, y0 float64) {
	s.text(svgW/2, y0+25, "middle", `font-size="16" font-weight="bold"`, "DLRM inference: bytes moved mediator↔node (model load + steps)")
	top, bot := y0+plotTop, y0+plotBot
	type group struct {
		tenants       int
		without, with *DLRMRun
	}
	var groups []*group
	most := 0.0
	for i := range runs {
		d := &runs[i]
		if len(groups) == 0 || groups[len(groups)-1].tenants != d.Tenants {
			groups = append(groups, &group{tenants: d.Tenants})
		}
		g := groups[len(groups)-1]
		if d.Hints {
			g.with = d
		} else {
			g.without = d
		}
		most = max(most, float64(d.Bytes()))
	}
	if len(groups) == 0 {
		s.text(svgW/2, (top+bot)/2, "middle", `font-size="14"`, "DLRM not measured")
		return
	}
	const mib = 1 << 20
	ymax, step := niceMax(most * 1.15 / mib)
	y := func(v float64) float64 { return bot - v/mib/ymax*(bot-top) }
	for v := 0.0; v <= ymax+step/2; v += step {
		s.line(plotLeft, y(v*mib), plotRight, y(v*mib), "#e0e0e0", "")
		s.text(plotLeft-8, y(v*mib)+4, "end", `font-size="12"`, fmt.Sprintf("%g", math.Round(v*1000)/1000))
	}
	s.line(plotLeft, bot, plotRight, bot, "#444", "")
	s.line(plotLeft, top, plotLeft, bot, "#444", "")
	s.printf(`<text x="%d" y="%.1f" text-anchor="middle" font-size="13" transform="rotate(-90 %d %.1f)">MiB moved</text>`+"\n",
		25, (top+bot)/2, 25, (top+bot)/2)
	slot := float64(plotRight-plotLeft) / float64(len(groups))
	bar := min(60, slot/3)
	for i, g := range groups {
		cx := plotLeft + slot*(float64(i)+0.5)
		for j, d := range []*DLRMRun{g.without, g.with} {
			if d == nil {
				continue
			}
			color := colorNoHints
			if d.Hints {
				color = colorHints
			}
			bx := cx - bar + float64(j)*bar
			by := y(float64(d.Bytes()))
			s.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n", bx+2, by, bar-4, bot-by, color,
				esc(fmt.Sprintf("%d tenants, hints %v: load %s, steps %s", d.Tenants, d.Hints, api.FormatSize(d.LoadBytes), api.FormatSize(d.StepBytes))))
			s.text(bx+bar/2, by-4, "middle", `font-size="11"`, api.FormatSize(d.Bytes()))
		}
		label := fmt.Sprintf("%d tenants", g.tenants)
		if g.tenants == 1 {
			label = "1 tenant"
		}
		s.text(cx, bot+20, "middle", `font-size="12"`, label)
		if g.with != nil && g.with.BytesRatio > 0 {
			s.text(cx, bot+36, "middle", `font-size="12" font-weight="bold"`, fmt.Sprintf("without / with: %.2f", g.with.BytesRatio))
		}
	}
	s.legend(plotLeft+10, top-12, [2]string{colorNoHints, "without hints"}, [2]string{colorHints, "with hints (weights sealed)"})
}
