// Command vgpuctl is the operator's tool for a vgpu mediator: status, the
// kernel catalog, a self-checking demo and the benchmark.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/bench"
)

const usage = `usage: vgpuctl [--socket PATH] [--timeout DURATION] COMMAND [flags]

commands:
  status [--json]   nodes, devices, memory and tenant sessions of the mediator
  tenants [--json]  tenants: limits from the quota file and current use
  tenants reload    re-read the quota file (the old one stays if the new one is invalid)
  kernels           the kernel catalog
  install docker|containerd [--config PATH] [--runtime-path PATH] [--tenant NAME]... [--dry-run]
                    add the vgpu runtimes to Docker or containerd; prints what to restart
  certs init --dir DIR [--node-host H]... [--mediator NAME] [--force]
                    create the cluster CA and node/mediator certificates for mutual TLS
  certs issue --dir DIR (--node NAME --host H [--host H]... | --mediator NAME) [--force]
                    one more node or mediator certificate from the CA in DIR
  demo              three tenants compute at once; every result is checked
  bench [--json] [--out DIR] [--max-size SIZE] [--tenants 1,2,4,8] ...
                    data path against raw baselines measured in the same run, as
                    ratios; --out writes JSON, markdown and an SVG chart (bench --help)
`

func main() {
	bench.ServePeerIfAsked() // a baseline peer process of vgpuctl bench
	socket := flag.String("socket", client.DefaultSocket, "mediator socket")
	flag.DurationVar(&operatorTimeout, "timeout", client.DefaultOperatorTimeout,
		"how long status, tenants and kernels wait for each answer of the mediator")
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage); flag.PrintDefaults() }
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if operatorTimeout <= 0 {
		fmt.Fprintf(os.Stderr, "vgpuctl: --timeout %v: want a duration above 0\n", operatorTimeout)
		os.Exit(2)
	}
	cmds := map[string]func(socket string, args []string) error{
		"status": status, "tenants": tenants, "kernels": kernelList, "install": installCmd, "certs": certsCmd, "demo": demo, "bench": benchCmd,
	}
	run, ok := cmds[flag.Arg(0)]
	if !ok {
		fmt.Fprintf(os.Stderr, "vgpuctl: unknown command %q\n", flag.Arg(0))
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*socket, flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vgpuctl:", err)
		os.Exit(1)
	}
}
