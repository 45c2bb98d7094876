// Command vgpu-mediator is the per-host vGPU hypervisor: it serves tenants
// on a Unix socket and runs their work on remote vgpu-node accelerators.
// With no --node it embeds a simulated node, a complete one-machine system.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/mediator"
)

type nodeList []string

func (n *nodeList) String() string     { return strings.Join(*n, ",") }
func (n *nodeList) Set(v string) error { *n = append(*n, v); return nil }

func main() {
	var nodes nodeList
	socket := flag.String("socket", client.DefaultSocket, "Unix socket to serve tenants and operators on")
	flag.Var(&nodes, "node", "vgpu-node address (host:port); repeat for several; none: run an embedded sim node")
	embMem := flag.String("embedded-memory", "8GiB", "memory per device of the embedded sim node")
	embDevs := flag.Int("embedded-devices", 1, "devices of the embedded sim node")
	tenantMem := flag.String("tenant-memory", "0", "cap on each session's device memory (0: none)")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	flag.Parse()
	if err := run(*socket, nodes, *embMem, *embDevs, *tenantMem, *level); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-mediator:", err)
		os.Exit(1)
	}
}

func run(socket string, nodes []string, embMem string, embDevs int, tenantMem, level string) error {
	log, err := daemon.Logger("vgpu-mediator", level)
	if err != nil {
		return err
	}
	limit, err := api.ParseSize(tenantMem)
	if err != nil {
		return fmt.Errorf("--tenant-memory: %w", err)
	}
	if len(nodes) == 0 {
		size, err := api.ParseSize(embMem)
		if err != nil {
			return fmt.Errorf("--embedded-memory: %w", err)
		}
		node, addr, err := accelerator.StartSim("127.0.0.1:0", embDevs, size, log.WithField("component", "embedded-node"))
		if err != nil {
			return err
		}
		defer node.Close()
		nodes = []string{addr.String()}
	}
	m, err := mediator.New(mediator.Config{Nodes: nodes, TenantMemory: limit, Log: log})
	if err != nil {
		return err
	}
	defer m.Close()
	l, err := daemon.ListenUnix(socket, 0o666)
	if err != nil {
		return fmt.Errorf("--socket: %w", err)
	}
	go func() {
		if err := m.Serve(l); err != nil {
			log.WithError(err).Error("stopped serving")
		}
	}()
	log.WithFields(map[string]any{"socket": socket, "nodes": nodes}).Info("serving")
	sig := daemon.WaitSignal()
	log.WithField("signal", sig.String()).Info("stopping")
	return nil
}
