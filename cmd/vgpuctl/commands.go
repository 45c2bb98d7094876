package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/models"
	"github.com/vgpu/vgpu/internal/workload"
)

// operatorTimeout is --timeout: every operator connection gives up on a
// mediator that does not answer within it.
var operatorTimeout = client.DefaultOperatorTimeout

const (
	statusUsage = `usage: vgpuctl status [--json]

The mediator's nodes and their devices (memory, used, retained weights,
launches), the device memory evicted to this host, and every tenant session.

Exits 3 when a node the mediator uses cannot be reached (its connection is
down, or its host was silent past the mediator's --node-timeout), after
printing the status and naming each such node on stderr; 0 when every node
answers.
`
	tenantsUsage = `usage: vgpuctl tenants [--json]
       vgpuctl tenants reload

tenants lists each tenant: its limits from the quota file and its current use.
reload makes the mediator re-read the quota file; if the new one is invalid,
the old one stays and the error says why.
`
	kernelsUsage = `usage: vgpuctl kernels

The kernel catalog of the mediator's nodes: each kernel's parameters and what
it computes.
`
	demoUsage = `usage: vgpuctl demo

Three tenants compute at once through the mediator (a decoder among them);
every result is checked against a reference computed here. Exits 1 if any
differs.
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
	op, err = client.DialOperatorTimeout(socket, operatorTimeout)
	return op, fs, *j, err
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

func status(socket string, args []string) error {
	op, _, asJSON, err := operatorCmd("status", socket, args)
	if err != nil {
		return err
	}
	defer op.Close()
	st, err := op.Status()
	if err != nil {
		return err
	}
	if asJSON {
		return cmp.Or(printJSON(st), nodesDown(st))
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tBACKEND\tDEVICE\tMEMORY\tUSED\tRETAINED\tLAUNCHES")
	for _, n := range st.Nodes {
		if n.Error != "" {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t(%s)\n", n.Addr, n.Error)
		}
		for _, d := range n.Devices {
			// Retained: sealed weights kept after their sessions, free to
			// any allocation that needs the memory.
			var retained uint64
			if d.Frames > 0 {
				retained = d.Memory / uint64(d.Frames) * uint64(d.Retained)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", n.Addr, n.Backend, d.Name, api.FormatSize(d.Memory), api.FormatSize(d.Used),
				api.FormatSize(retained), d.Launches)
		}
	}
	fmt.Fprintf(w, "\nevicted device memory on this host: %s in RAM, %s in the spill file\n\n", api.FormatSize(st.HostRAM), api.FormatSize(st.HostSpilled))
	fmt.Fprintln(w, "TENANT\tNAMESPACE/CONTAINER\tSESSION\tALLOCATIONS\tALLOCATED\tIN 4K/64K/2M PAGES\tRESIDENT\tEVICTED\tTLB HITS\tIN\tOUT\tLAUNCHES")
	for _, t := range st.Tenants {
		ctr := t.Container
		if ctr == "" {
			ctr = "-"
		} else if len(ctr) > 12 {
			ctr = ctr[:12]
		}
		if t.Namespace != "" { // one id may be used in several namespaces
			ctr = t.Namespace + "/" + ctr
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s / %s / %s\t%s\t%s\t%.1f%%\t%s\t%s\t%d\n", t.Tenant, ctr, t.Session, t.Allocations,
			api.FormatSize(t.Allocated), api.FormatSize(t.Mapped4K), api.FormatSize(t.Mapped64K), api.FormatSize(t.Mapped2M),
			api.FormatSize(t.Resident), api.FormatSize(t.Evicted), 100*t.TLBHitRate,
			api.FormatSize(t.CopiedIn), api.FormatSize(t.CopiedOut), t.Launches)
	}
	return cmp.Or(w.Flush(), nodesDown(st))
}

func kernelList(socket string, _ []string) error {
	op, err := client.DialOperatorTimeout(socket, operatorTimeout)
	if err != nil {
		return err
	}
	defer op.Close()
	ks, err := op.Kernels()
	if err != nil {
		return err
	}
	for _, k := range ks {
		params := make([]string, len(k.Params))
		for i, p := range k.Params {
			params[i] = p.Name + " " + p.Kind.String()
			// A buffer's element type is part of its contract: an index
			// buffer holds i32, not the f32 most take. 0 is a node too old
			// to say.
			if p.Kind == api.ArgBuffer && p.DType != 0 {
				params[i] += "(" + p.DType.String() + ")"
			}
		}
		fmt.Printf("%s(%s)\n    %s\n", k.Name, strings.Join(params, ", "), k.Doc)
	}
	return nil
}

// demoPrompt and demoTokens size the demo's decoder run: a prompt
// prefilled, then tokens generated greedily, every pass checked.
const demoPrompt, demoTokens = 16, 32

func demo(socket string, _ []string) error {
	ws := append(workload.Demo(), models.DecoderDemo(models.SmallGPT, demoPrompt, demoTokens))
	results := make([]workload.Result, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = workload.Execute(socket, fmt.Sprintf("tenant-%c", 'a'+i), w)
		}()
	}
	wg.Wait()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWORKLOAD\tWORK\tBYTES MOVED\tTIME\tCHECK")
	var errs []error
	for _, r := range results {
		check := "passed"
		switch {
		case r.Err != nil:
			check = "error: " + r.Err.Error()
			errs = append(errs, fmt.Errorf("%s: %s: %w", r.Tenant, r.Workload, r.Err))
		case !r.Checked:
			check = "FAILED: " + r.Detail
			errs = append(errs, fmt.Errorf("%s: %s: result differs from the reference: %s", r.Tenant, r.Workload, r.Detail))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\n", r.Tenant, r.Workload, r.Work, api.FormatSize(r.Bytes), r.Elapsed.Round(1e6), check)
	}
	tw.Flush()
	return errors.Join(errs...)
}

func tenants(socket string, args []string) error {
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
	limit := func(n uint64) string {
		if n == 0 {
			return "-"
		}
		return api.FormatSize(n)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tMEMORY CAP\tCOMPUTE\tBANDWIDTH/s\tCONTAINERS\tRESERVED\tALLOCATED\tCHARGED")
	for _, t := range ts {
		maxc := "-"
		if t.MaxContainers > 0 {
			maxc = fmt.Sprint(t.MaxContainers)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d/%s\t%s\t%s\t%s\n", t.Name, limit(t.Memory), t.Compute, limit(t.Bandwidth),
			t.Containers, maxc, api.FormatSize(t.Reserved), api.FormatSize(t.Allocated), api.FormatSize(t.Charged))
	}
	return w.Flush()
}
