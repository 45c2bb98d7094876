package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/models"
	"github.com/vgpu/vgpu/internal/progress"
	"github.com/vgpu/vgpu/internal/workload"
)

// operatorTimeout is --timeout: every operator connection gives up on a
// mediator that does not answer within it.
var operatorTimeout = client.DefaultOperatorTimeout

const (
	tenantsUsage = `usage: vgpuctl tenants [--json]
       vgpuctl tenants reload
       vgpuctl tenants apply [--etcd ENDPOINTS] FILE

tenants lists each tenant: every limit of the quota file (memory cap,
default_memory, compute weight, compute_max, bandwidth, max_containers,
oversubscribe, dedup_charge) and its current use (containers, memory
reserved for them, allocated, charged).
reload makes the mediator re-read the quota file; if the new one is invalid,
the old one stays and the error says why.
apply validates FILE and stores it in etcd as the cluster's quota file, which
every mediator started with --etcd uses from then on (cluster mode,
docs/cluster.md); an invalid file is refused with every mistake and changes
nothing.
`
	kernelsUsage = `usage: vgpuctl kernels [--json]

The kernel catalog of the mediator's nodes: each kernel's parameters and what
it computes.
`
	demoUsage = `usage: vgpuctl demo [--json]

Four tenants compute at once through the mediator (a decoder among them);
every result is checked against a reference computed here. Exits 1 if any
differs. On a terminal, stderr shows how many have finished as they go.
`
)

// jsonFlags is the flag set of a command whose only flag is --json.
func jsonFlags(name string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error says what is wrong; help is vgpuctl's
	return fs, fs.Bool("json", false, "print JSON")
}

// jsonFlagsOnly is jsonFlags for help, which lists the flags.
func jsonFlagsOnly(name string) func(string) *flag.FlagSet {
	return func(string) *flag.FlagSet { fs, _ := jsonFlags(name); return fs }
}

// operatorCmd parses a command's --json flag and connects as an operator.
func operatorCmd(name, socket string, args []string) (op *client.Operator, fs *flag.FlagSet, asJSON bool, err error) {
	fs, j := jsonFlags(name)
	if err := fs.Parse(args); err != nil {
		return nil, nil, false, err
	}
	op, err = dialOperator(socket)
	return op, fs, *j, err
}

func dialOperator(socket string) (*client.Operator, error) {
	return client.DialOperatorTimeout(socket, operatorTimeout)
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// exitNodesDown is vgpuctl status's exit status when a node cannot be
// reached: distinct from 1 (vgpuctl or the mediator failed) so that a
// probe or a script tells a degraded system from a failed query.
const exitNodesDown = 3

// nodesDownError is status's error when nodes cannot be reached; its exit
// status is exitNodesDown.
type nodesDownError struct{ nodes []api.NodeStatus }

func (e *nodesDownError) Error() string {
	msgs := make([]string, len(e.nodes))
	for i, n := range e.nodes {
		msgs[i] = fmt.Sprintf("node %s is unreachable: %s", n.Addr, n.Error)
	}
	return strings.Join(msgs, "; ")
}

func (e *nodesDownError) exitCode() int { return exitNodesDown }

// nodesDown is the error of a status whose nodes do not all answer; nil
// when they do. The mediator sets a node's Error when it cannot reach it.
func nodesDown(st *api.Status) error {
	var down []api.NodeStatus
	for _, n := range st.Nodes {
		if n.Error != "" {
			down = append(down, n)
		}
	}
	if len(down) == 0 {
		return nil
	}
	return &nodesDownError{down}
}

// kernelJSON is a kernel of vgpuctl kernels --json.
type kernelJSON struct {
	Name   string      `json:"name"`
	Doc    string      `json:"doc"`
	Params []paramJSON `json:"params"`
}

type paramJSON struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	DType string `json:"dtype,omitempty"` // a buffer's element type, where the node says
}

func kernelList(socket string, args []string) error {
	op, _, asJSON, err := operatorCmd("kernels", socket, args)
	if err != nil {
		return err
	}
	defer op.Close()
	ks, err := op.Kernels()
	if err != nil {
		return err
	}
	out := make([]kernelJSON, len(ks))
	for i, k := range ks {
		out[i] = kernelJSON{Name: k.Name, Doc: k.Doc, Params: make([]paramJSON, len(k.Params))}
		for j, p := range k.Params {
			out[i].Params[j] = paramJSON{Name: p.Name, Kind: p.Kind.String()}
			// A buffer's element type is part of its contract: an index
			// buffer holds i32, not the f32 most take. 0 is a node too old
			// to say.
			if p.Kind == api.ArgBuffer && p.DType != 0 {
				out[i].Params[j].DType = p.DType.String()
			}
		}
	}
	if asJSON {
		return printJSON(out)
	}
	for _, k := range out {
		params := make([]string, len(k.Params))
		for i, p := range k.Params {
			params[i] = p.Name + " " + p.Kind
			if p.DType != "" {
				params[i] += "(" + p.DType + ")"
			}
		}
		fmt.Printf("%s(%s)\n    %s\n", k.Name, strings.Join(params, ", "), k.Doc)
	}
	return nil
}

// demoPrompt and demoTokens size the demo's decoder run: a prompt
// prefilled, then tokens generated greedily, every pass checked.
const demoPrompt, demoTokens = 16, 32

// demoResult is a workload of vgpuctl demo --json.
type demoResult struct {
	Tenant   string        `json:"tenant"`
	Workload string        `json:"workload"`
	Work     string        `json:"work"`
	Bytes    uint64        `json:"bytes_moved"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	Checked  bool          `json:"checked"` // the result matched the reference
	Detail   string        `json:"detail,omitempty"`
	Error    string        `json:"error,omitempty"`
}

func demo(socket string, args []string) error {
	fs, asJSON := jsonFlags("demo")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ws := append(workload.Demo(), models.DecoderDemo(models.SmallGPT, demoPrompt, demoTokens))
	line := progress.Start(os.Stderr, "demo", *asJSON, progress.Terminal)
	line.Total(len(ws))
	line.Show(fmt.Sprintf("%d tenants computing", len(ws)))
	results := make([]workload.Result, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			results[i] = workload.Execute(socket, fmt.Sprintf("tenant-%c", 'a'+i), w)
			line.Step(fmt.Sprintf("%s finished %s", results[i].Tenant, w.Name))
		})
	}
	wg.Wait()
	line.Done()
	var errs []error
	out := make([]demoResult, len(results))
	for i, r := range results {
		out[i] = demoResult{Tenant: r.Tenant, Workload: r.Workload, Work: r.Work, Bytes: r.Bytes, Elapsed: r.Elapsed, Checked: r.Err == nil && r.Checked, Detail: r.Detail}
		switch {
		case r.Err != nil:
			out[i].Error = r.Err.Error()
			errs = append(errs, fmt.Errorf("%s: %s: %w", r.Tenant, r.Workload, r.Err))
		case !r.Checked:
			errs = append(errs, fmt.Errorf("%s: %s: result differs from the reference: %s", r.Tenant, r.Workload, r.Detail))
		}
	}
	if *asJSON {
		return errors.Join(append([]error{printJSON(out)}, errs...)...)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWORKLOAD\tWORK\tBYTES MOVED\tTIME\tCHECK")
	for _, r := range out {
		check := "passed"
		switch {
		case r.Error != "":
			check = "error: " + r.Error
		case !r.Checked:
			check = "FAILED: " + r.Detail
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\n", r.Tenant, r.Workload, r.Work, api.FormatSize(r.Bytes), r.Elapsed.Round(1e6), check)
	}
	tw.Flush()
	return errors.Join(errs...)
}

func tenants(socket string, args []string) error {
	if len(args) > 0 && args[0] == "apply" { // to etcd, not to a mediator
		return tenantsApply(args[1:])
	}
	op, fs, asJSON, err := operatorCmd("tenants", socket, args)
	if err != nil {
		return err
	}
	defer op.Close()
	switch fs.Arg(0) {
	case "reload":
		if err := op.Reload(); err != nil {
			return err
		}
		fmt.Println("quotas reloaded")
		return nil
	case "":
	default:
		return fmt.Errorf("tenants: unknown subcommand %q (want: reload)", fs.Arg(0))
	}
	ts, err := op.Tenants()
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(ts)
	}
	if err := renderTenants(os.Stdout, ts); err != nil {
		return err
	}
	return renderClusterUse(os.Stdout, ts)
}

// tenantColumn is a column of vgpuctl tenants: a quota field (the name of
// its isolation.Tenant field; "" for use, not a limit) and its value.
type tenantColumn struct {
	header, field string
	value         func(api.TenantInfo) string
}

// none is a limit of 0: no cap.
func none[T comparable](v T, f func(T) string) string {
	var zero T
	if v == zero {
		return "-"
	}
	return f(v)
}

// tenantColumns show every limit of a tenant's quota, and its use; a test
// fails when isolation.Tenant has a field no column shows.
var tenantColumns = []tenantColumn{
	{"TENANT", "Name", func(t api.TenantInfo) string { return t.Name }},
	{"MEMORY CAP", "Memory", func(t api.TenantInfo) string { return none(t.Memory, api.FormatSize) }},
	{"DEFAULT", "DefaultMemory", func(t api.TenantInfo) string { return none(t.DefaultMemory, api.FormatSize) }},
	{"COMPUTE", "Compute", func(t api.TenantInfo) string { return fmt.Sprint(t.Compute) }},
	{"MAX SHARE", "ComputeMax", func(t api.TenantInfo) string {
		return none(t.ComputeMax, func(v float64) string { return fmt.Sprintf("%.4g%%", 100*v) })
	}},
	{"BANDWIDTH/s", "Bandwidth", func(t api.TenantInfo) string { return none(t.Bandwidth, api.FormatSize) }},
	{"OVERSUB", "Oversubscribe", func(t api.TenantInfo) string { return fmt.Sprintf("%.4gx", t.Oversubscribe) }},
	{"DEDUP", "DedupCharge", func(t api.TenantInfo) string { return fmt.Sprintf("%.4g", t.DedupCharge) }},
	{"CONTAINERS", "MaxContainers", func(t api.TenantInfo) string {
		return fmt.Sprintf("%d/%s", t.Containers, none(t.MaxContainers, func(n int) string { return fmt.Sprint(n) }))
	}},
	{"RESERVED", "", func(t api.TenantInfo) string { return api.FormatSize(t.Reserved) }},
	{"ALLOCATED", "", func(t api.TenantInfo) string { return api.FormatSize(t.Allocated) }},
	{"CHARGED", "", func(t api.TenantInfo) string { return api.FormatSize(t.Charged) }},
	{"LOST", "", func(t api.TenantInfo) string { return api.FormatSize(t.Lost) }},
}

func renderTenants(out io.Writer, ts []api.TenantInfo) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	cells := make([]string, len(tenantColumns))
	for i, c := range tenantColumns {
		cells[i] = c.header
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
	for _, t := range ts {
		for i, c := range tenantColumns {
			cells[i] = c.value(t)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	return w.Flush()
}
