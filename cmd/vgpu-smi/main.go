// Command vgpu-smi shows, inside a container, the vGPU that container has:
// its virtual devices with the memory it was granted, the memory it uses
// against its cap, its tenant's compute weight and share, its sessions. It
// asks the mediator over the container's own socket, which answers for
// that container only (OpSelf): another tenant's data never reaches it.
//
// vgpu-runtime mounts it read-only into the containers that ask for a
// vGPU, so it must run in any image: it is built static (CGO_ENABLED=0)
// and imports no NVML binding.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/version"
)

const usage = `usage: vgpu-smi [--socket PATH] [--sample DURATION] [--json]

Shows the vGPU of this container: its devices with the memory it was
granted, the memory it uses and its cap, its compute weight and share of
device time, and its sessions. It reads them from the mediator over the
container's socket ($VGPU_SOCKET, else /run/vgpu/mediator.sock); the
mediator answers with this container's data only.

Flags:
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is vgpu-smi: it returns the exit status (0, 1 for a failure to ask
// the mediator, 2 for bad usage).
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vgpu-smi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "the container's mediator socket (default $VGPU_SOCKET, else "+client.DefaultSocket+")")
	sample := fs.Duration("sample", 250*time.Millisecond, "time between the two readings the utilization is measured over; 0: one reading, no utilization")
	asJSON := fs.Bool("json", false, "print the mediator's answer as JSON (the readings' last)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.String("vgpu-smi"))
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vgpu-smi: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *sample < 0 || *sample > time.Minute {
		fmt.Fprintf(stderr, "vgpu-smi: --sample %v: want 0 to 1m\n", *sample)
		return 2
	}
	if *socket == "" {
		*socket = os.Getenv("VGPU_SOCKET")
	}
	if *socket == "" {
		*socket = client.DefaultSocket
	}
	prev, cur, elapsed, err := read(*socket, *sample)
	if err != nil {
		fmt.Fprintf(stderr, "vgpu-smi: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(cur); err != nil {
			fmt.Fprintf(stderr, "vgpu-smi: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprint(stdout, render(prev, cur, elapsed))
	return 0
}

// read takes one reading of the container's view, or two sample apart.
func read(socket string, sample time.Duration) (prev, cur *api.SelfStatus, elapsed time.Duration, err error) {
	op, err := client.DialOperatorTimeout(socket, 10*time.Second)
	if err != nil {
		return nil, nil, 0, err
	}
	defer op.Close()
	t0 := time.Now()
	cur, err = op.Self()
	if err != nil || sample == 0 {
		return nil, cur, 0, err
	}
	time.Sleep(sample)
	prev = cur
	t1 := time.Now()
	cur, err = op.Self()
	return prev, cur, t1.Sub(t0), err
}

// render is the table vgpu-smi prints for the reading cur; with an earlier
// reading prev, elapsed before, it adds each device's utilization: the
// share of that time the container's tenant ran kernels on it.
func render(prev, cur *api.SelfStatus, elapsed time.Duration) string {
	var b strings.Builder
	line := "+" + strings.Repeat("-", 78) + "+\n"
	fmt.Fprintf(&b, "%s\n", version.String("vgpu-smi"))
	b.WriteString(line)
	row(&b, fmt.Sprintf("Tenant: %s   Container: %s", cur.Tenant, container(cur)))
	row(&b, fmt.Sprintf("Memory: %s / %s%s   Compute: weight %d, cap %s   Bandwidth: %s",
		mib(cur.Charged), mib(cur.Memory), resident(cur), cur.Compute, capOf(cur.ComputeMax), bandwidth(cur.Bandwidth)))
	b.WriteString(line)
	row(&b, fmt.Sprintf("%-4s %-14s %-18s %-19s %5s %8s", "vGPU", "Name", "Node", "Memory-Usage", "Util", "Launches"))
	b.WriteString(strings.Replace(line, "-", "=", -1))
	for _, d := range cur.Devices {
		name, node := d.Name, d.Node
		if name == "" {
			name, node = "(no session)", "-"
		}
		use := fmt.Sprintf("%s / %s", mib(d.Used), mib(d.Memory))
		row(&b, fmt.Sprintf("%4d %-14s %-18s %-19s %5s %8d", d.Index, clip(name, 14), clip(node, 18), use, util(prev, d, elapsed), d.Launches))
	}
	b.WriteString(line)
	if len(cur.Sessions) == 0 {
		row(&b, "No sessions")
	} else {
		row(&b, fmt.Sprintf("%-8s %-7s %-10s %-9s %-8s %-8s %-8s %8s", "Session", "Devices", "Allocated", "Resident", "Evicted", "Copy-in", "Copy-out", "Launches"))
		for _, s := range cur.Sessions {
			row(&b, fmt.Sprintf("%-8d %-7d %-10s %-9s %-8s %-8s %-8s %8d", s.Session, s.Devices, mib(s.Allocated), mib(s.Resident),
				mib(s.Evicted), mib(s.CopiedIn), mib(s.CopiedOut), s.Launches))
		}
	}
	b.WriteString(line)
	return b.String()
}

// row writes s as one row of the table, clipped to its width.
func row(b *strings.Builder, s string) { fmt.Fprintf(b, "| %-76s |\n", clip(s, 76)) }

// clip shortens s to n runes, marking the cut with '~'.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "~"
}

func container(st *api.SelfStatus) string {
	if st.Namespace == "" {
		return clip(st.Container, 24)
	}
	return fmt.Sprintf("%s (namespace %s)", clip(st.Container, 24), st.Namespace)
}

// mib prints bytes as whole MiB, as nvidia-smi does (a part MiB rounds up,
// so memory in use never reads as 0).
func mib(n uint64) string { return fmt.Sprintf("%dMiB", (n+(1<<20)-1)>>20) }

func resident(st *api.SelfStatus) string {
	if st.Resident == 0 || st.Resident == st.Memory {
		return ""
	}
	return fmt.Sprintf(" (%s resident)", mib(st.Resident))
}

func capOf(share float64) string {
	if share == 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f%%", 100*share)
}

func bandwidth(bps uint64) string {
	if bps == 0 {
		return "no cap"
	}
	return api.FormatSize(bps) + "/s"
}

// util is the share of elapsed the tenant ran kernels on d, since prev.
func util(prev *api.SelfStatus, d api.SelfDevice, elapsed time.Duration) string {
	if prev == nil || elapsed <= 0 || int(d.Index) >= len(prev.Devices) {
		return "-"
	}
	dt := d.DeviceTime - prev.Devices[d.Index].DeviceTime
	if dt < 0 { // another physical device behind it now: no rate
		return "-"
	}
	return fmt.Sprintf("%.0f%%", min(100, 100*float64(dt)/float64(elapsed)))
}
