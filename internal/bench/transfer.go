package bench

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Transfer is host↔device copies of one size beside their baselines, all
// measured in the same interleaved rounds (rounds.go): every MB/s figure
// is the median over the rounds, every ratio the median of the rounds'
// ratios.
type Transfer struct {
	Bytes      int     `json:"bytes"`
	Reps       int     `json:"reps"` // host→device copies of Bytes per timed window
	MemcpyMBps float64 `json:"memcpy_mb_per_s"`
	// The raw stream to a receiver process (the baseline of the ratios),
	// and to a receiver goroutine of this process.
	RawTCPMBps       float64 `json:"raw_tcp_mb_per_s"`
	RawTCPInprocMBps float64 `json:"raw_tcp_inproc_mb_per_s"`
	H2DMBps          float64 `json:"h2d_mb_per_s"`
	D2HMBps          float64 `json:"d2h_mb_per_s"`
	H2DRatio         float64 `json:"h2d_ratio"` // h2d / raw TCP
	D2HRatio         float64 `json:"d2h_ratio"` // d2h / raw TCP
	BulkSpread
}

// BulkSpread is what interleaved rounds add to a size's figures: the
// ratios' ranges, the parallel streams and the best raw transport, and
// the copies judged against it. Report embeds the headline size's.
type BulkSpread struct {
	H2DRatioMin float64 `json:"h2d_ratio_min"`
	H2DRatioMax float64 `json:"h2d_ratio_max"`
	D2HRatioMin float64 `json:"d2h_ratio_min"`
	D2HRatioMax float64 `json:"d2h_ratio_max"`
	// The same bytes split over RawTCPStreams streams, each to a receiver
	// process of its own, at once.
	RawTCPParallelMBps float64 `json:"raw_tcp_parallel_mb_per_s"`
	RawTCPStreams      int     `json:"raw_tcp_streams"`
	// BestRaw names the fastest raw transport of the size (by median):
	// "tcp" (to a process), "tcp_inproc" or "tcp_parallel"; memcpy is not
	// one, since the bytes have to reach the node over a socket.
	BestRaw         string  `json:"best_raw"`
	BestRawMBps     float64 `json:"best_raw_mb_per_s"`
	H2DBestRatio    float64 `json:"h2d_best_ratio"` // h2d / the best raw transport
	H2DBestRatioMin float64 `json:"h2d_best_ratio_min"`
	H2DBestRatioMax float64 `json:"h2d_best_ratio_max"`
	D2HBestRatio    float64 `json:"d2h_best_ratio"` // d2h / the best raw transport
	D2HBestRatioMin float64 `json:"d2h_best_ratio_min"`
	D2HBestRatioMax float64 `json:"d2h_best_ratio_max"`
}

// DefaultSizes are the transfer sizes measured, up to Options.MaxBytes.
var DefaultSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// sizesFor lists DefaultSizes up to maxBytes, with headline among them.
func sizesFor(maxBytes, headline int) []int {
	var out []int
	for _, s := range DefaultSizes {
		if s > maxBytes {
			break
		}
		if headline < s && (len(out) == 0 || out[len(out)-1] < headline) {
			out = append(out, headline)
		}
		out = append(out, s)
	}
	if len(out) == 0 || out[len(out)-1] < headline {
		out = append(out, headline)
	}
	return out
}

// fillPattern writes a pattern that differs in every 8-byte word, so that a
// chunk landing at the wrong offset does not compare equal.
func fillPattern(b []byte) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], uint64(i)*0x9E3779B97F4A7C15+1)
		copy(b[i:], w[:])
	}
}

// firstDiff is the first offset where a and b (of equal length) differ, or
// -1.
func firstDiff(a, b []byte) int {
	const block = 64 << 10
	for off := 0; off < len(a); off += block {
		end := min(off+block, len(a))
		if !bytes.Equal(a[off:end], b[off:end]) {
			for i := off; i < end; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	return -1
}

// transfers measures each size: in interleaved rounds of sliced windows
// (sc, rounds.go), the raw TCP stream to a process, to a
// goroutine and split over parallel streams, memcpy, host→device and
// device→host, each a number of copies of the size back to back (a copy's
// windows one Synchronize each). Host buffers come from c.HostAlloc unless
// pageable. Every device→host window's bytes are compared with what was
// copied in.
func transfers(c *client.Client, sizes []int, sc schedule, pageable bool, progress func(string)) ([]Transfer, error) {
	largest := sizes[len(sizes)-1]
	var src, dst []byte
	if pageable {
		src, dst = make([]byte, largest), make([]byte, largest)
	} else {
		var err error
		if src, err = c.HostAlloc(largest); err != nil {
			return nil, err
		}
		defer c.HostFree(src)
		if dst, err = c.HostAlloc(largest); err != nil {
			return nil, err
		}
		defer c.HostFree(dst)
	}
	fillPattern(src)
	clear(dst) // touches every page before any timing
	link, err := dialTCPLink()
	if err != nil {
		return nil, fmt.Errorf("raw TCP stream: %w", err)
	}
	defer link.Close()
	sink, err := dialSink(largest)
	if err != nil {
		return nil, fmt.Errorf("raw TCP stream to a process: %w", err)
	}
	defer sink.Close()
	par, err := dialParallel(parallelStreams(), largest)
	if err != nil {
		return nil, fmt.Errorf("parallel raw TCP streams: %w", err)
	}
	defer par.Close()
	s := c.Stream()
	out := make([]Transfer, 0, len(sizes))
	// rates are each contender's bytes per second at the last size, to
	// guess the next size's window.
	rates := map[string]float64{}
	for _, size := range sizes {
		progress(fmt.Sprintf("host↔device copies of %s", api.FormatSize(uint64(size))))
		t, err := transfer(c, s, links{link, sink, par}, src[:size], dst[:size], sc, rates)
		if err != nil {
			return nil, fmt.Errorf("copies of %s: %w", api.FormatSize(uint64(size)), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// links are the raw streams a transfer is measured beside.
type links struct {
	inproc   *tcpLink
	sink     *sinkLink
	parallel parallelLink
}

// The contenders of a transfer size, in the order interleave reports them.
const (
	cRaw = iota
	cInproc
	cParallel
	cMemcpy
	cH2D
	cD2H
)

func transfer(c *client.Client, s *client.Stream, link links, src, dst []byte, sc schedule, rates map[string]float64) (Transfer, error) {
	size := len(src)
	t := Transfer{Bytes: size}
	p, err := c.Malloc(0, uint64(size))
	if err != nil {
		return t, err
	}
	defer c.Free(p)
	// An untimed first copy commits the device memory, as a warm-up round
	// of a GPU bandwidth test does.
	s.CopyToDevice(p, src)
	if err := s.Synchronize(); err != nil {
		return t, fmt.Errorf("host to device: %w", err)
	}
	cs := []*contender{
		cRaw:      {name: "raw TCP stream", run: func(n int) (time.Duration, error) { return link.sink.stream(src, n) }},
		cInproc:   {name: "raw TCP stream in process", run: func(n int) (time.Duration, error) { return link.inproc.stream(dst, src, n) }},
		cParallel: {name: "parallel raw TCP streams", run: func(n int) (time.Duration, error) { return link.parallel.stream(src, n) }},
		cMemcpy:   {name: "memcpy", run: func(n int) (time.Duration, error) { return memcpyTime(dst, src, n), nil }},
		cH2D: {name: "host to device", run: func(n int) (time.Duration, error) {
			start := time.Now()
			for range n {
				s.CopyToDevice(p, src)
			}
			err := s.Synchronize()
			return time.Since(start), err
		}},
		cD2H: {name: "device to host", run: func(n int) (time.Duration, error) {
			clear(dst) // what device→host brings back is checked below
			start := time.Now()
			for range n {
				s.CopyFromDevice(dst, p)
			}
			if err := s.Synchronize(); err != nil {
				return 0, err
			}
			d := time.Since(start)
			if i := firstDiff(dst, src); i >= 0 {
				return 0, fmt.Errorf("returned byte %#x at offset %d, %#x was copied in: %w", dst[i], i, src[i], api.ErrInternal)
			}
			return d, nil
		}},
	}
	for _, c := range cs {
		c.n = int(rates[c.name] * sc.window.Seconds() / float64(size))
	}
	sc.part = "copies of " + api.FormatSize(uint64(size))
	perRound, err := interleave(cs, sc)
	if err != nil {
		return t, err
	}
	mb := make([][]float64, len(cs))
	for i, c := range cs {
		mb[i] = scaled(perRound[i], float64(size)/1e6)
		rates[c.name] = spreadOf(perRound[i]).Median * float64(size)
	}
	med := func(i int) float64 { return spreadOf(mb[i]).Median }
	t.Reps = cs[cH2D].n
	t.RawTCPMBps, t.RawTCPInprocMBps, t.MemcpyMBps = med(cRaw), med(cInproc), med(cMemcpy)
	t.RawTCPParallelMBps, t.RawTCPStreams = med(cParallel), len(link.parallel)
	t.H2DMBps, t.D2HMBps = med(cH2D), med(cD2H)
	h2d, d2h := ratioSpread(mb[cH2D], mb[cRaw]), ratioSpread(mb[cD2H], mb[cRaw])
	t.H2DRatio, t.H2DRatioMin, t.H2DRatioMax = h2d.Median, h2d.Min, h2d.Max
	t.D2HRatio, t.D2HRatioMin, t.D2HRatioMax = d2h.Median, d2h.Min, d2h.Max
	best := cRaw
	for _, i := range []int{cInproc, cParallel} {
		if med(i) > med(best) {
			best = i
		}
	}
	t.BestRaw, t.BestRawMBps = map[int]string{cRaw: "tcp", cInproc: "tcp_inproc", cParallel: "tcp_parallel"}[best], med(best)
	h2d, d2h = ratioSpread(mb[cH2D], mb[best]), ratioSpread(mb[cD2H], mb[best])
	t.H2DBestRatio, t.H2DBestRatioMin, t.H2DBestRatioMax = h2d.Median, h2d.Min, h2d.Max
	t.D2HBestRatio, t.D2HBestRatioMin, t.D2HBestRatioMax = d2h.Median, d2h.Min, d2h.Max
	return t, nil
}
