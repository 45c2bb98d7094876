package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/bench"
)

const benchUsage = `usage: vgpuctl bench [flags]

Measures the data path and its baselines side by side, in one run: host↔device
copies per size against memcpy and a raw TCP stream, a small synchronous
operation against a raw ping-pong, tiny kernel launches per second, DLRM-style
inference for several tenants without and with residency hints, a GPT-style
decoder as registered graphs against op-by-op launches (and decoding beside
another tenant's prefills, and several tenants loading one model), and TLS on
the node link. Prints markdown tables (or --json); --out also writes
` + bench.JSONFile + `, ` + bench.MarkdownFile + ` and ` + bench.SVGFile + ` there.

flags:
`

func benchCmd(socket string, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), benchUsage); fs.PrintDefaults() }
	asJSON := fs.Bool("json", false, "print JSON instead of markdown")
	out := fs.String("out", "", "also write the JSON, markdown and SVG chart to this directory")
	size := fs.String("size", "256MiB", "headline bulk copy size (h2d_ratio, d2h_ratio); alone, also the largest size")
	maxSize := fs.String("max-size", "1GiB", "largest host↔device copy size (sizes: 4KiB 64KiB 1MiB 16MiB 64MiB 256MiB 1GiB)")
	rounds := fs.Int("rounds", 5, "timed rounds of each copy size (the median counts)")
	pageable := fs.Bool("pageable", false, "bulk host buffers of ordinary memory instead of HostAlloc's shared memory")
	ops := fs.Int("ops", 2000, "small operations to time")
	launches := fs.Int("launches", 20000, "asynchronous tiny kernel launches to time")
	tenants := fs.String("tenants", "1,2,4,8", `DLRM tenant counts, comma-separated ("0": skip DLRM)`)
	table := fs.String("dlrm-table", "64MiB", "DLRM embedding table size (at most --max-size)")
	steps := fs.Int("dlrm-steps", 32, "DLRM inference steps per tenant")
	decodeSteps := fs.Int("decode-steps", 64, `decoder: decode steps timed per way and round ("0": skip the decoder)`)
	decodeRounds := fs.Int("decode-rounds", 5, "decoder: rounds of graph against op by op")
	floodSteps := fs.Int("flood-steps", 400, "decoder: decode steps timed alone, and again beside a prefill flood")
	loadTenants := fs.Int("load-tenants", 8, "decoder: tenants loading one model")
	nodeLink := fs.String("node-link", "", `bytes of the TLS-against-plain node link comparison (default min(--size, 64MiB); "0": skip)`)
	command := fs.String("command", "", "how this run was started, for the reports (default: this vgpuctl command line)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	opt := bench.Options{Socket: socket, Rounds: *rounds, Pageable: *pageable, SmallOps: *ops, Launches: *launches, Command: *command}
	if opt.Command == "" {
		opt.Command = strings.TrimSpace("vgpuctl bench " + strings.Join(args, " "))
	}
	var err error
	if set["size"] || !set["max-size"] {
		if opt.BulkBytes, err = parseSize("--size", *size); err != nil {
			return err
		}
	}
	if set["max-size"] || !set["size"] {
		if opt.MaxBytes, err = parseSize("--max-size", *maxSize); err != nil {
			return err
		}
	} else {
		opt.MaxBytes = opt.BulkBytes
	}
	if opt.BulkBytes > opt.MaxBytes {
		return fmt.Errorf("--size %s is larger than --max-size %s: %w", *size, *maxSize, api.ErrInvalidArgument)
	}
	if opt.Tenants, err = parseTenants(*tenants); err != nil {
		return err
	}
	if opt.DLRM.TableBytes, err = parseSize("--dlrm-table", *table); err != nil {
		return err
	}
	opt.DLRM.TableBytes = min(opt.DLRM.TableBytes, opt.MaxBytes)
	opt.DLRM.Steps = *steps
	opt.Decoder = bench.DecoderOptions{Steps: *decodeSteps, Rounds: *decodeRounds, FloodSteps: *floodSteps, LoadTenants: *loadTenants}
	switch {
	case *decodeSteps == 0:
		opt.Decoder.Steps = -1
	case *decodeSteps < 0 || *decodeRounds < 1 || *floodSteps < 1 || *loadTenants < 1:
		return fmt.Errorf("--decode-steps %d, --decode-rounds %d, --flood-steps %d, --load-tenants %d: want positive counts: %w",
			*decodeSteps, *decodeRounds, *floodSteps, *loadTenants, api.ErrInvalidArgument)
	}
	if *nodeLink != "" {
		n, err := api.ParseSize(*nodeLink)
		if err != nil {
			return fmt.Errorf("--node-link: %w", err)
		}
		opt.NodeLinkBytes = int(n)
		if n == 0 {
			opt.NodeLinkBytes = -1
		}
	}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		opt.Progress = func(what string) { fmt.Fprintf(os.Stderr, "bench: %s…\n", what) }
	}

	r, err := bench.Run(opt)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := r.WriteFiles(*out); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(os.Stderr, "wrote %s/{%s,%s,%s}\n", *out, bench.JSONFile, bench.MarkdownFile, bench.SVGFile)
		}
	}
	if *asJSON {
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
