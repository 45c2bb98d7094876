package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/vgpu/vgpu/api"
)

const statusUsage = `usage: vgpuctl status [-o wide|json] [--json]

The mediator's nodes and their devices (memory, used, retained weights,
launches); for cuda devices, each GPU as NVML reads it now (utilization,
memory used by every process, temperature, power, ECC errors corrected/
uncorrected; n/a where the GPU lacks the reading); the device memory
evicted to this host, the registered containers with what each has
reserved, and every tenant session. The default view fits 100 columns
(long names are cut, marked …); -o wide shows every column and whole
names, each GPU's UUID, PCI bus id and MIG mode, and why NVML could not
read a GPU shown as unreadable; --json (or -o json) prints everything as
JSON.

Exits 3 when a node the mediator uses cannot be reached (its connection is
down, or its host was silent past the mediator's --node-timeout), after
printing the status and naming each such node on stderr; 0 when every node
answers.
`

// statusWidth is what the default view of vgpuctl status fits in.
const statusWidth = 100

// outputFlags are the flags of a command that prints a table: --json, and
// -o for another view of it (views: the ones it has besides json).
func outputFlags(name string, views ...string) (*flag.FlagSet, func() (string, error)) {
	fs, asJSON := jsonFlags(name)
	o := fs.String("o", "", "output: "+joinViews(append(views, "json")))
	return fs, func() (string, error) {
		switch {
		case *asJSON || *o == "json":
			return "json", nil
		case *o == "":
			return "", nil
		}
		for _, v := range views {
			if *o == v {
				return v, nil
			}
		}
		return "", fmt.Errorf("-o %q: want %s: %w", *o, joinViews(append(views, "json")), api.ErrInvalidArgument)
	}
}

func joinViews(vs []string) string {
	s := ""
	for i, v := range vs {
		if i > 0 {
			s += " or "
		}
		s += v
	}
	return s
}

func statusFlags() (*flag.FlagSet, func() (string, error)) { return outputFlags("status", "wide") }

func status(socket string, args []string) error {
	fs, view := statusFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	v, err := view()
	if err != nil {
		return err
	}
	op, err := dialOperator(socket)
	if err != nil {
		return err
	}
	defer op.Close()
	st, err := op.Status()
	if err != nil {
		return err
	}
	if v == "json" {
		return cmp.Or(printJSON(st), nodesDown(st))
	}
	return cmp.Or(renderStatus(os.Stdout, st, v == "wide"), renderCluster(os.Stdout, st.Cluster), nodesDown(st))
}

// renderStatus writes the status tables: the default view cuts names and
// leaves out columns so that no line passes statusWidth; wide has them all.
func renderStatus(out io.Writer, st *api.Status, wide bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	// fit cuts s to n columns in the default view.
	fit := func(s string, n int) string {
		if wide {
			return s
		}
		return clip(s, n)
	}
	if wide {
		fmt.Fprintln(w, "NODE\tBACKEND\tDEVICE\tMEMORY\tUSED\tRETAINED\tLAUNCHES\tERROR")
	} else {
		fmt.Fprintln(w, "NODE\tBACKEND\tDEVICE\tMEMORY\tUSED\tRETAINED\tLAUNCHES")
	}
	for _, n := range st.Nodes {
		if n.Error != "" {
			// The error itself goes to stderr (nodesDown) in every view.
			if wide {
				fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t%s\n", n.Addr, n.Error)
			} else {
				fmt.Fprintf(w, "%s\t-\tunreachable\t-\t-\t-\t-\n", fit(n.Addr, 20))
			}
		}
		for _, d := range n.Devices {
			// Retained: sealed weights kept after their sessions, free to
			// any allocation that needs the memory.
			var retained uint64
			if d.Frames > 0 {
				retained = d.Memory / uint64(d.Frames) * uint64(d.Retained)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", fit(n.Addr, 20), fit(n.Backend, 7), fit(d.Name, 16),
				api.FormatSize(d.Memory), api.FormatSize(d.Used), api.FormatSize(retained), count(d.Launches, wide))
		}
	}
	renderGPUs(w, st, wide, fit)
	fmt.Fprintf(w, "\nevicted device memory on this host: %s in RAM, %s in the spill file\n\n", api.FormatSize(st.HostRAM), api.FormatSize(st.HostSpilled))

	// ctr names a container as namespace/id: an id may be used in several
	// namespaces. The default view shows the id's first 12 characters, as
	// docker ps does, after at most 7 of the namespace.
	ctr := func(ns, id string) string {
		if id == "" {
			return "-"
		}
		if !wide && len(id) > 12 {
			id = id[:12]
		}
		switch {
		case ns == "":
			return id
		case wide:
			return ns + "/" + id
		}
		return clip(ns, 7) + "/" + id
	}
	type key struct{ ns, id string }
	sessions := map[key]int{}
	for _, t := range st.Tenants {
		if t.Container != "" {
			sessions[key{t.Namespace, t.Container}]++
		}
	}
	fmt.Fprintln(w, "TENANT\tNAMESPACE/CONTAINER\tRESERVED\tCOMPUTE\tDEVICES\tSESSIONS")
	if len(st.Containers) == 0 {
		fmt.Fprintln(w, "(no containers registered)")
	}
	for _, c := range st.Containers {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\n", fit(c.Tenant, 16), ctr(c.Namespace, c.Container), api.FormatSize(c.Memory),
			c.Compute, max(c.Devices, 1), sessions[key{c.Namespace, c.Container}])
	}
	fmt.Fprintln(w)

	if wide {
		fmt.Fprintln(w, "TENANT\tNAMESPACE/CONTAINER\tSESSION\tALLOCATIONS\tALLOCATED\tIN 4K/64K/2M PAGES\tRESIDENT\tEVICTED\tLOST\tTLB HITS\tIN\tOUT\tLAUNCHES")
	} else {
		fmt.Fprintln(w, "TENANT\tNAMESPACE/CONTAINER\tSESSION\tALLOCATED\tRESIDENT\tEVICTED\tLAUNCHES")
	}
	if len(st.Tenants) == 0 {
		fmt.Fprintln(w, "(no sessions)")
	}
	for _, t := range st.Tenants {
		if wide {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s / %s / %s\t%s\t%s\t%s\t%.1f%%\t%s\t%s\t%d\n", t.Tenant, ctr(t.Namespace, t.Container), t.Session, t.Allocations,
				api.FormatSize(t.Allocated), api.FormatSize(t.Mapped4K), api.FormatSize(t.Mapped64K), api.FormatSize(t.Mapped2M),
				api.FormatSize(t.Resident), api.FormatSize(t.Evicted), api.FormatSize(t.Lost), 100*t.TLBHitRate,
				api.FormatSize(t.CopiedIn), api.FormatSize(t.CopiedOut), t.Launches)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", clip(t.Tenant, 16), ctr(t.Namespace, t.Container), count(t.Session, false),
			api.FormatSize(t.Allocated), api.FormatSize(t.Resident), api.FormatSize(t.Evicted), count(t.Launches, false))
	}
	return w.Flush()
}

// renderGPUs writes the table of the GPUs behind the nodes' devices (cuda
// devices, as NVML read them for this status), if any device has one: the
// default view their load, memory used, temperature, power and ECC errors
// (corrected/uncorrected); wide adds what each GPU is, the GPU's memory, and
// why NVML could not read one. A reading the GPU does not offer shows as
// n/a.
func renderGPUs(w io.Writer, st *api.Status, wide bool, fit func(string, int) string) {
	header := false
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			g := d.GPU
			if g == nil {
				continue
			}
			if !header {
				header = true
				if wide {
					fmt.Fprintln(w, "\nNODE\tDEVICE\tGPU\tUUID\tPCI BUS\tMIG\tUTIL\tGPU MEM USED\tTEMP\tPOWER\tECC CORR/UNCORR\tERROR")
				} else {
					fmt.Fprintln(w, "\nNODE\tDEVICE\tGPU\tUTIL\tGPU MEM USED\tTEMP\tPOWER\tECC CORR/UNCORR")
				}
			}
			util, used, temp, power, ecc := g.Readings(func(n uint64) string { return count(n, wide) })
			if wide {
				if g.Error == "" {
					used += " / " + api.FormatSize(g.Memory)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Addr, d.Name, g.Index, g.UUID, g.PCIBusID, g.MIG,
					util, used, temp, power, ecc, g.Error)
				continue
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", fit(n.Addr, 20), fit(d.Name, 16), g.Index, util, used, temp, power, ecc)
		}
	}
}

// clip cuts s to n columns, the last one "…" where it cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// count is n in full where there is room (wide), else in at most 7
// columns: 12345678 is 12.3M.
func count(n uint64, wide bool) string {
	if wide || n < 10_000_000 {
		return fmt.Sprint(n)
	}
	const units = "KMGTPE"
	v, i := float64(n)/1000, 0
	for v >= 999.95 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return fmt.Sprintf("%.1f%c", v, units[i])
}
