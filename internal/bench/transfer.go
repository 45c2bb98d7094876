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
// measured in the same rounds.
type Transfer struct {
	Bytes      int     `json:"bytes"`
	Reps       int     `json:"reps"` // copies of Bytes per timed round
	MemcpyMBps float64 `json:"memcpy_mb_per_s"`
	// The raw stream to a receiver process (the baseline of the ratios),
	// and to a receiver goroutine of this process.
	RawTCPMBps       float64 `json:"raw_tcp_mb_per_s"`
	RawTCPInprocMBps float64 `json:"raw_tcp_inproc_mb_per_s"`
	H2DMBps          float64 `json:"h2d_mb_per_s"`
	D2HMBps          float64 `json:"d2h_mb_per_s"`
	H2DRatio         float64 `json:"h2d_ratio"` // h2d / raw TCP
	D2HRatio         float64 `json:"d2h_ratio"` // d2h / raw TCP
}

// DefaultSizes are the transfer sizes measured, up to Options.MaxBytes.
var DefaultSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// Small sizes are timed over many back-to-back copies per round, so that a
// round lasts long enough to measure: repBytes in all, at most maxReps.
const (
	repBytes = 64 << 20
	maxReps  = 4096
)

func repsFor(size int) int { return max(1, min(maxReps, repBytes/size)) }

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

// transfers measures each size: per round, the raw TCP stream, memcpy,
// host→device and device→host, each reps copies of the size back to back
// (one Synchronize per round). Host buffers come from c.HostAlloc unless
// pageable. Every size's device→host bytes are compared with what was
// copied in.
func transfers(c *client.Client, sizes []int, rounds int, pageable bool, progress func(string)) ([]Transfer, error) {
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
	s := c.Stream()
	out := make([]Transfer, 0, len(sizes))
	for _, size := range sizes {
		progress(fmt.Sprintf("host↔device copies of %s", api.FormatSize(uint64(size))))
		t, err := transfer(c, s, links{link, sink}, src[:size], dst[:size], rounds)
		if err != nil {
			return nil, fmt.Errorf("copies of %s: %w", api.FormatSize(uint64(size)), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// links are the raw streams a transfer is measured beside.
type links struct {
	inproc *tcpLink
	sink   *sinkLink
}

func transfer(c *client.Client, s *client.Stream, link links, src, dst []byte, rounds int) (Transfer, error) {
	size := len(src)
	t := Transfer{Bytes: size, Reps: repsFor(size)}
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
	var raw, inproc, mem, h2d, d2h []time.Duration
	for range rounds {
		d, err := link.sink.stream(src, t.Reps)
		if err != nil {
			return t, fmt.Errorf("raw TCP stream: %w", err)
		}
		raw = append(raw, d)
		if d, err = link.inproc.stream(dst, src, t.Reps); err != nil {
			return t, fmt.Errorf("raw TCP stream in process: %w", err)
		}
		inproc = append(inproc, d)
		mem = append(mem, memcpyTime(dst, src, t.Reps))

		start := time.Now()
		for range t.Reps {
			s.CopyToDevice(p, src)
		}
		if err := s.Synchronize(); err != nil {
			return t, fmt.Errorf("host to device: %w", err)
		}
		h2d = append(h2d, time.Since(start))

		clear(dst) // what device→host brings back is checked below
		start = time.Now()
		for range t.Reps {
			s.CopyFromDevice(dst, p)
		}
		if err := s.Synchronize(); err != nil {
			return t, fmt.Errorf("device to host: %w", err)
		}
		d2h = append(d2h, time.Since(start))
	}
	if i := firstDiff(dst, src); i >= 0 {
		return t, fmt.Errorf("device to host returned byte %#x at offset %d, %#x was copied in: %w", dst[i], i, src[i], api.ErrInternal)
	}
	n := size * t.Reps
	t.RawTCPMBps, t.RawTCPInprocMBps, t.MemcpyMBps = mbps(n, medianOf(raw)), mbps(n, medianOf(inproc)), mbps(n, medianOf(mem))
	t.H2DMBps, t.D2HMBps = mbps(n, medianOf(h2d)), mbps(n, medianOf(d2h))
	t.H2DRatio, t.D2HRatio = ratio(t.H2DMBps, t.RawTCPMBps), ratio(t.D2HMBps, t.RawTCPMBps)
	return t, nil
}
