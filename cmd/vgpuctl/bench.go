package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/bench"
	"github.com/vgpu/vgpu/internal/progress"
)

const benchUsage = `usage: vgpuctl bench [flags]

Measures the data path and its baselines side by side, in one run: host↔device
copies per size against memcpy and a raw TCP stream, a small synchronous
operation against a raw ping-pong, tiny kernel launches per second, DLRM-style
inference for several tenants without and with residency hints, a GPT-style
decoder as registered graphs against op-by-op launches (and decoding beside
another tenant's prefills, and several tenants loading one model), and TLS on
the node link. Timed figures take turns in --rounds interleaved rounds of
windows of at least --window each, each window cut into --slices slices that
alternate with the other figures' slices, and are reported as the median with
the range of the rounds. Prints markdown tables (or --json); --out also writes
` + bench.JSONFile + `, ` + bench.MarkdownFile + ` and ` + bench.SVGFile + ` there.
`

// benchArgs are bench's flags.
type benchArgs struct {
	asJSON       *bool
	out          *string
	size         *string
	maxSize      *string
	rounds       *int
	slices       *int
	window       *time.Duration
	pageable     *bool
	ops          *int
	launches     *int
	tenants      *string
	table        *string
	steps        *int
	decodeSteps  *int
	decodeRounds *int
	floodSteps   *int
	loadTenants  *int
	nodeLink     *string
	command      *string
	sliceLog     *string
}

func benchFlags() (*flag.FlagSet, *benchArgs) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error says what is wrong; help is vgpuctl's
	a := &benchArgs{}
	a.asJSON = fs.Bool("json", false, "print JSON instead of markdown")
	a.out = fs.String("out", "", "also write the JSON, markdown and SVG chart to this directory")
	a.size = fs.String("size", "256MiB", "headline bulk copy size (h2d_ratio, d2h_ratio); alone, also the largest size")
	a.maxSize = fs.String("max-size", "1GiB", "largest host↔device copy size (sizes: 4KiB 64KiB 1MiB 16MiB 64MiB 256MiB 1GiB)")
	a.rounds = fs.Int("rounds", 9, "interleaved rounds of every timed figure (the median counts, the range is reported)")
	a.slices = fs.Int("slices", bench.DefaultSlices, "slices each timed window is cut into, taking turns with the other figures' slices within a round (1: windows one after the other)")
	a.window = fs.Duration("window", bench.DefaultWindow, "least time a timed window of work lasts (small copies and operations are repeated to fill it)")
	a.pageable = fs.Bool("pageable", false, "bulk host buffers of ordinary memory instead of HostAlloc's shared memory")
	a.ops = fs.Int("ops", 0, "small operations per window at least (0: as many as fill --window)")
	a.launches = fs.Int("launches", 0, "asynchronous tiny kernel launches per window at least (0: as many as fill --window)")
	a.tenants = fs.String("tenants", "1,2,4,8", `DLRM tenant counts, comma-separated ("0": skip DLRM)`)
	a.table = fs.String("dlrm-table", "64MiB", "DLRM embedding table size (at most --max-size)")
	a.steps = fs.Int("dlrm-steps", 32, "DLRM inference steps per tenant")
	a.decodeSteps = fs.Int("decode-steps", 64, `decoder: decode steps timed per way and round ("0": skip the decoder)`)
	a.decodeRounds = fs.Int("decode-rounds", 5, "decoder: rounds of graph against op by op")
	a.floodSteps = fs.Int("flood-steps", 400, "decoder: decode steps timed alone, and again beside a prefill flood")
	a.loadTenants = fs.Int("load-tenants", 8, "decoder: tenants loading one model")
	a.nodeLink = fs.String("node-link", "", `bytes of the TLS-against-plain node link comparison (default min(--size, 64MiB); "0": skip)`)
	a.sliceLog = fs.String("slice-log", "", "write a line for each timed slice to this file: round, figure, the figure timed just before it, units, seconds")
	a.command = fs.String("command", "", "how this run was started, for the reports (default: this vgpuctl command line)")
	return fs, a
}

func benchCmd(socket string, args []string) error {
	fs, a := benchFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *a.rounds < 1 || *a.slices < 1 || *a.window <= 0 || *a.ops < 0 || *a.launches < 0 {
		return fmt.Errorf("--rounds %d, --slices %d, --window %v, --ops %d, --launches %d: want at least one round and one slice, a positive window, no negative counts: %w",
			*a.rounds, *a.slices, *a.window, *a.ops, *a.launches, api.ErrInvalidArgument)
	}
	opt := bench.Options{Socket: socket, Rounds: *a.rounds, Slices: *a.slices, Window: *a.window, Pageable: *a.pageable, SmallOps: *a.ops, Launches: *a.launches, Command: *a.command}
	if opt.Command == "" {
		opt.Command = strings.TrimSpace("vgpuctl bench " + strings.Join(args, " "))
	}
	var err error
	if set["size"] || !set["max-size"] {
		if opt.BulkBytes, err = parseSize("--size", *a.size); err != nil {
			return err
		}
	}
	if set["max-size"] || !set["size"] {
		if opt.MaxBytes, err = parseSize("--max-size", *a.maxSize); err != nil {
			return err
		}
	} else {
		opt.MaxBytes = opt.BulkBytes
	}
	if opt.BulkBytes > opt.MaxBytes {
		return fmt.Errorf("--size %s is larger than --max-size %s: %w", *a.size, *a.maxSize, api.ErrInvalidArgument)
	}
	if opt.Tenants, err = parseTenants(*a.tenants); err != nil {
		return err
	}
	if opt.DLRM.TableBytes, err = parseSize("--dlrm-table", *a.table); err != nil {
		return err
	}
	opt.DLRM.TableBytes = min(opt.DLRM.TableBytes, opt.MaxBytes)
	opt.DLRM.Steps = *a.steps
	opt.Decoder = bench.DecoderOptions{Steps: *a.decodeSteps, Rounds: *a.decodeRounds, FloodSteps: *a.floodSteps, LoadTenants: *a.loadTenants}
	switch {
	case *a.decodeSteps == 0:
		opt.Decoder.Steps = -1
	case *a.decodeSteps < 0 || *a.decodeRounds < 1 || *a.floodSteps < 1 || *a.loadTenants < 1:
		return fmt.Errorf("--decode-steps %d, --decode-rounds %d, --flood-steps %d, --load-tenants %d: want positive counts: %w",
			*a.decodeSteps, *a.decodeRounds, *a.floodSteps, *a.loadTenants, api.ErrInvalidArgument)
	}
	if *a.nodeLink != "" {
		n, err := api.ParseSize(*a.nodeLink)
		if err != nil {
			return fmt.Errorf("--node-link: %w", err)
		}
		opt.NodeLinkBytes = int(n)
		if n == 0 {
			opt.NodeLinkBytes = -1
		}
	}
	closeLog := func() error { return nil }
	if *a.sliceLog != "" {
		f, err := os.Create(*a.sliceLog)
		if err != nil {
			return fmt.Errorf("--slice-log: %w", err)
		}
		w := bufio.NewWriter(f)
		opt.SliceLog = w
		closeLog = func() error {
			if err := errors.Join(w.Flush(), f.Close()); err != nil {
				return fmt.Errorf("--slice-log %s: %w", *a.sliceLog, err)
			}
			return nil
		}
	}
	// On a terminal, one line on stderr says what is being measured, as
	// step n of the run's; nothing where stderr is piped, or with --json.
	line := progress.Start(os.Stderr, "bench", *a.asJSON, progress.Terminal)
	line.Total(opt.Steps())
	opt.Progress = line.Step
	r, err := bench.Run(opt)
	line.Done()
	if err != nil {
		return errors.Join(err, closeLog())
	}
	// The results are written even if the log fails: its error comes last.
	if err := writeBench(r, *a.out, *a.asJSON); err != nil {
		return errors.Join(err, closeLog())
	}
	return closeLog()
}

// writeBench writes r to dir (if set) and prints it, as JSON or markdown.
func writeBench(r *bench.Report, out string, asJSON bool) error {
	if out != "" {
		if err := r.WriteFiles(out); err != nil {
			return err
		}
		if !asJSON {
			fmt.Fprintf(os.Stderr, "wrote %s/{%s,%s,%s}\n", out, bench.JSONFile, bench.MarkdownFile, bench.SVGFile)
		}
	}
	if asJSON {
		return r.WriteJSON(os.Stdout)
	}
	return r.WriteMarkdown(os.Stdout, "")
}

func parseSize(flag, s string) (int, error) {
	n, err := api.ParseSize(s)
	if err == nil && n == 0 {
		err = fmt.Errorf("size 0: %w", api.ErrInvalidArgument)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", flag, err)
	}
	return int(n), nil
}

// parseTenants reads "1,2,4,8"; "0" or "" is no DLRM run.
func parseTenants(s string) ([]int, error) {
	out := []int{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--tenants %q: want tenant counts like 1,2,4,8: %w", s, api.ErrInvalidArgument)
		}
		if n == 0 {
			return []int{}, nil
		}
		out = append(out, n)
	}
	return out, nil
}
