// Package bench measures the vgpu data path against raw baselines taken in
// the same run, since a figure alone on a noisy machine means little: every
// result is reported beside its baseline and as a ratio to it.
//
// Timed figures are taken in interleaved rounds of windows of at least
// Options.Window of work each, the system and its baselines taking turns,
// and reported as the median over the rounds with the range beside it
// (rounds.go).
//
// One run (Run) measures, in this order:
//   - host↔device copies of sizes from 4 KiB to 1 GiB (transfer.go), each
//     beside memcpy and a raw loopback TCP stream of the same bytes to a
//     receiver process (and, reported apart, to a receiver goroutine, and
//     split over parallel streams to processes of their own: the best of
//     the three is the best raw transport, a second baseline of the
//     copies); host buffers come from the session's shared host
//     memory (client.HostAlloc, as GPU bandwidth tests use pinned memory)
//     unless Options.Pageable; every size is read back and compared;
//   - a small synchronous operation's round trip beside a raw ping-pong
//     that takes the same two hops (Unix socket, then TCP) through a relay
//     process to an echo process, as a request goes from tenant to
//     mediator to node (peer.go; and, reported apart, through goroutines
//     of one process, baseline.go);
//   - asynchronous launches per second of a tiny kernel, checked, in the
//     same rounds as the ping-pong and reported against it too;
//   - a DLRM-style inference step served by 1, 2, 4 and 8 tenants at once,
//     checked against a pure-Go reference, without and with residency
//     hints, counting the bytes the mediator moved to and from nodes
//     (dlrm.go);
//   - a GPT-style decoder driven as registered graphs and op by op, a
//     decode beside another tenant's prefills with phases and without, and
//     tenants loading one model (decoder.go);
//   - the cost of TLS on the mediator↔node link, apart from the mediator
//     under test (NodeLink): the same in-process node written to over plain
//     TCP and over mutual TLS, alternately.
//
// The Report is written as JSON, a markdown table per section and an SVG
// chart (report.go, svg.go).
package bench

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Report holds one run's measurements. Its JSON (MarshalJSON) is flat at
// the top: the headline figures, every ratio of the system to its baseline
// under a key ending in _ratio; the per-size and per-tenant-count figures
// in the arrays transfers and dlrm.
type Report struct {
	Command   string `json:"command"`    // how the run was started
	Date      string `json:"date"`       // RFC 3339, when it started
	CPUs      int    `json:"cpus"`       // of the benchmarking process's machine
	GoOSArch  string `json:"go_os_arch"` // GOOS/GOARCH
	HostAlloc bool   `json:"host_alloc"` // bulk host buffers from client.HostAlloc
	Rounds    int    `json:"rounds"`     // interleaved rounds of every timed figure
	Slices    int    `json:"slices"`     // slices a window is cut into, alternating with the other figures'
	// WindowS is the least time, in seconds, a timed window of work lasts.
	WindowS float64 `json:"window_s"`
	// The headline bulk size's figures, also in Transfers.
	BulkBytes  int     `json:"bulk_bytes"`
	MemcpyMBps float64 `json:"memcpy_mb_per_s"`
	RawTCPMBps float64 `json:"raw_tcp_mb_per_s"`
	H2DMBps    float64 `json:"h2d_mb_per_s"`
	D2HMBps    float64 `json:"d2h_mb_per_s"`
	H2DRatio   float64 `json:"h2d_ratio"`
	D2HRatio   float64 `json:"d2h_ratio"`
	BulkSpread

	// The raw ping-pong through relay and echo processes (the baseline of
	// small_op_ratio), and through goroutines of this process.
	RawPingPongUs         float64 `json:"raw_ping_pong_us"`
	RawPingPongInprocUs   float64 `json:"raw_ping_pong_inproc_us"`
	SmallOpUs             float64 `json:"small_op_us"`
	SmallOpRatio          float64 `json:"small_op_ratio"`
	SmallOpInprocRatio    float64 `json:"small_op_inproc_ratio"`
	SmallOpRatioMin       float64 `json:"small_op_ratio_min"`
	SmallOpRatioMax       float64 `json:"small_op_ratio_max"`
	SmallOpInprocRatioMin float64 `json:"small_op_inproc_ratio_min"`
	SmallOpInprocRatioMax float64 `json:"small_op_inproc_ratio_max"`
	SmallOpSamples        int     `json:"small_op_samples"` // timed in all rounds
	// Asynchronous launches of a tiny kernel (fill_f32 of one float) queued
	// on one stream and synchronized once per window, per second of the
	// window: the median of the rounds, and the range.
	LaunchesPerS    float64 `json:"launches_per_s"`
	LaunchesPerSMin float64 `json:"launches_per_s_min"`
	LaunchesPerSMax float64 `json:"launches_per_s_max"`
	Launches        int     `json:"launches"` // timed in all rounds
	// LaunchPingPongRatio is launches per second over the raw ping-pong's
	// round trips per second, round by round: how many launches go in the
	// time of one round trip through two processes, a figure that the
	// host's speed of the moment mostly cancels out of.
	LaunchPingPongRatio    float64 `json:"launch_ping_pong_ratio"`
	LaunchPingPongRatioMin float64 `json:"launch_ping_pong_ratio_min"`
	LaunchPingPongRatioMax float64 `json:"launch_ping_pong_ratio_max"`

	// HintBytesRatio is DLRM's bytes moved without hints over with them,
	// at the largest tenant count (per count: DLRMRun.BytesRatio, and the
	// keys dlrm_<T>_tenants_bytes_ratio).
	HintBytesRatio float64 `json:"hint_bytes_ratio"`

	Transfers []Transfer `json:"transfers"`
	DLRMModel DLRMShape  `json:"dlrm_model"`
	DLRM      []DLRMRun  `json:"dlrm"`
	// NodeLink compares plain TCP and mutual TLS to a node (in process,
	// not the mediator's nodes); nil when skipped.
	*NodeLinkReport
	// The GPT-style decoder as registered graphs and op by op, beside a
	// prefill flood, and loaded by several tenants (decoder.go); nil when
	// skipped.
	*DecoderReport
}

// Options size a run; zero values take the defaults.
type Options struct {
	Socket  string
	Command string // recorded in the report; default "vgpuctl bench"
	// BulkBytes is the headline size, whose figures are the report's
	// h2d_ratio and d2h_ratio; default 256 MiB, or MaxBytes if smaller.
	BulkBytes int
	// MaxBytes caps the transfer sizes (DefaultSizes); default 1 GiB, and
	// at least BulkBytes.
	MaxBytes int
	Rounds   int  // interleaved rounds of every timed figure, the median counts; default 9
	Pageable bool // bulk host buffers from the Go heap instead of HostAlloc
	// Window is the least time a timed window of work lasts; default
	// DefaultWindow.
	Window time.Duration
	// Slices is how many slices a window is cut into, alternating with
	// the other contenders' (rounds.go); default DefaultSlices.
	Slices   int
	SmallOps int // small operations per window at least; default as many as fill Window
	Launches int // asynchronous tiny launches per window at least; default as many as fill Window
	// Tenants are the DLRM tenant counts, each positive; nil: 1, 2, 4, 8;
	// empty: no DLRM run.
	Tenants []int
	DLRM    DLRMShape
	// NodeLinkBytes sizes the TLS-against-plain comparison to an in-process
	// node; default min(BulkBytes, 64 MiB); negative: skip it.
	NodeLinkBytes int
	// Decoder sizes the decoder part; Decoder.Steps negative skips it.
	Decoder DecoderOptions
	// SliceLog, if set, gets a line for each slice timed of the copies,
	// the small operation, the launches and their baselines: the part
	// ("copies of 64 KiB", "small"), round, figure, the figure timed just
	// before it, units and seconds, tab-separated (what one figure leaves
	// behind weighs on the next: docs/datapath.md, "What is measured").
	SliceLog io.Writer
	// Progress, if set, hears what is being measured as the run goes.
	Progress func(string)
}

// schedule is how the options say to interleave the timed figures.
func (o *Options) schedule() schedule {
	return schedule{rounds: o.Rounds, slices: o.Slices, window: o.Window, log: o.SliceLog}
}

func (o *Options) defaults() {
	if o.Command == "" {
		o.Command = "vgpuctl bench"
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 30
		if o.BulkBytes > o.MaxBytes {
			o.MaxBytes = o.BulkBytes
		}
	}
	if o.BulkBytes <= 0 {
		o.BulkBytes = min(256<<20, o.MaxBytes)
	}
	o.MaxBytes = max(o.MaxBytes, o.BulkBytes)
	if o.Rounds <= 0 {
		o.Rounds = 9
	}
	if o.Slices <= 0 {
		o.Slices = DefaultSlices
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Tenants == nil {
		o.Tenants = []int{1, 2, 4, 8}
	}
	o.DLRM.Defaults(o.MaxBytes)
	o.Decoder.defaults()
	if o.NodeLinkBytes == 0 {
		o.NodeLinkBytes = min(o.BulkBytes, 64<<20)
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
}

// Steps is how many times Run calls Progress with opt: once for each step
// of the run, so that a progress line can say "[3/12]".
func (opt Options) Steps() int {
	opt.defaults()
	n := len(sizesFor(opt.MaxBytes, opt.BulkBytes)) + 1 + 2*len(opt.Tenants) // copies, small operations, DLRM
	if opt.Decoder.Steps >= 0 {
		n += 5 // graph against ops, two floods, two loads
	}
	if opt.NodeLinkBytes > 0 {
		n++
	}
	return n
}

// Run measures baselines and the system side by side.
func Run(opt Options) (*Report, error) {
	opt.defaults()
	if i := slices.IndexFunc(opt.Tenants, func(n int) bool { return n <= 0 }); i >= 0 {
		return nil, fmt.Errorf("DLRM with %d tenants: want at least 1: %w", opt.Tenants[i], api.ErrInvalidArgument)
	}
	if opt.Decoder.Steps >= 0 {
		if err := opt.Decoder.check(); err != nil {
			return nil, err
		}
	}
	r := &Report{
		Command: opt.Command, Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(),
		GoOSArch: runtime.GOOS + "/" + runtime.GOARCH, HostAlloc: !opt.Pageable,
		Rounds: opt.Rounds, Slices: opt.Slices, WindowS: opt.Window.Seconds(), BulkBytes: opt.BulkBytes, DLRMModel: opt.DLRM,
	}
	if err := oneSession(r, opt); err != nil {
		return nil, err
	}
	var err error
	if len(opt.Tenants) > 0 {
		if r.DLRM, err = dlrm(opt.Socket, opt.DLRM, opt.Tenants, opt.Progress); err != nil {
			return nil, err
		}
		r.HintBytesRatio = r.DLRM[len(r.DLRM)-1].BytesRatio
	}

	if opt.Decoder.Steps >= 0 {
		if r.DecoderReport, err = decoder(opt.Socket, opt.Decoder, opt.Progress); err != nil {
			return nil, err
		}
	}
	if opt.NodeLinkBytes > 0 {
		opt.Progress("mediator→node writes, TLS against plain TCP")
		if r.NodeLinkReport, err = NodeLink(opt.NodeLinkBytes, opt.Rounds, opt.Window); err != nil {
			return nil, fmt.Errorf("node link, TLS against plain TCP: %w", err)
		}
	}
	return r, nil
}

// oneSession measures what one tenant session does alone: transfers, the
// small operation and launches.
func oneSession(r *Report, opt Options) error {
	c, err := client.Dial(client.Options{Socket: opt.Socket, Tenant: "bench"})
	if err != nil {
		return err
	}
	defer c.Close()
	if r.Transfers, err = transfers(c, sizesFor(opt.MaxBytes, opt.BulkBytes), opt.schedule(), opt.Pageable, opt.Progress); err != nil {
		return err
	}
	for _, t := range r.Transfers {
		if t.Bytes == opt.BulkBytes {
			r.MemcpyMBps, r.RawTCPMBps, r.H2DMBps, r.D2HMBps = t.MemcpyMBps, t.RawTCPMBps, t.H2DMBps, t.D2HMBps
			r.H2DRatio, r.D2HRatio, r.BulkSpread = t.H2DRatio, t.D2HRatio, t.BulkSpread
		}
	}
	opt.Progress("small synchronous operations and launches")
	return small(c, r, opt)
}

// small measures a 4-byte synchronous device→host copy against the raw
// ping-pongs, and the rate of asynchronous tiny launches, all four taking
// turns in the same rounds.
func small(c *client.Client, r *Report, opt Options) error {
	p, err := c.Malloc(0, 4<<10)
	if err != nil {
		return err
	}
	defer c.Free(p)
	pp, err := ProcessPingPong()
	if err != nil {
		return fmt.Errorf("raw ping-pong: %w", err)
	}
	defer pp.Close()
	ping := pp.Conn
	pingIn, stopIn, err := inProcessPingPong()
	if err != nil {
		return fmt.Errorf("raw ping-pong in process: %w", err)
	}
	defer stopIn()
	s := c.Stream()
	b := make([]byte, 4)
	const (
		cPing = iota
		cPingIn
		cOp
		cLaunch
	)
	cs := []*contender{
		cPing:   {name: "raw ping-pong", run: func(n int) (time.Duration, error) { return pingPong(ping, n) }},
		cPingIn: {name: "raw ping-pong in process", run: func(n int) (time.Duration, error) { return pingPong(pingIn, n) }},
		cOp: {name: "small operation", min: opt.SmallOps, run: func(n int) (time.Duration, error) {
			start := time.Now()
			for range n {
				s.CopyFromDevice(b, p)
				if err := s.Synchronize(); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}},
		cLaunch: {name: "launches", min: opt.Launches, run: func(n int) (time.Duration, error) { return launches(s, p, n) }},
	}
	sc := opt.schedule()
	sc.part = "small"
	rates, err := interleave(cs, sc)
	if err != nil {
		return err
	}
	med := func(i int) float64 { return spreadOf(rates[i]).Median }
	r.RawPingPongUs, r.RawPingPongInprocUs, r.SmallOpUs = 1e6/med(cPing), 1e6/med(cPingIn), 1e6/med(cOp)
	r.SmallOpSamples, r.Launches = cs[cOp].n*opt.Rounds, cs[cLaunch].n*opt.Rounds
	// A time's ratio is the inverse of the rates'.
	op, in := ratioSpread(rates[cPing], rates[cOp]), ratioSpread(rates[cPingIn], rates[cOp])
	r.SmallOpRatio, r.SmallOpRatioMin, r.SmallOpRatioMax = op.Median, op.Min, op.Max
	r.SmallOpInprocRatio, r.SmallOpInprocRatioMin, r.SmallOpInprocRatioMax = in.Median, in.Min, in.Max
	l, lp := spreadOf(rates[cLaunch]), ratioSpread(rates[cLaunch], rates[cPing])
	r.LaunchesPerS, r.LaunchesPerSMin, r.LaunchesPerSMax = l.Median, l.Min, l.Max
	r.LaunchPingPongRatio, r.LaunchPingPongRatioMin, r.LaunchPingPongRatioMax = lp.Median, lp.Min, lp.Max
	return nil
}

// launches queues n launches of a one-float fill on s and waits for them
// all; then, untimed, it checks that the last one took effect.
func launches(s *client.Stream, p client.Ptr, n int) (time.Duration, error) {
	start := time.Now()
	for i := range n {
		s.Launch("fill_f32", client.Buf(p), client.I64(1), client.F32(float32(i)))
	}
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	d := time.Since(start)
	got := make([]byte, 4)
	s.CopyFromDevice(got, p)
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	if v := client.BytesFloat32(got)[0]; v != float32(n-1) {
		return 0, fmt.Errorf("after %d launches the buffer holds %g, want %d: %w", n, v, n-1, api.ErrInternal)
	}
	return d, nil
}
