// Command vgpu-node exports this host's accelerators to vgpu mediators.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/daemon"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7070", "address to serve mediators on (host:port)")
	backend := flag.String("backend", "sim", "device backend: sim (memory in host RAM, kernels on CPU)")
	devices := flag.Int("devices", 1, "number of devices")
	memory := flag.String("memory", "16GiB", "memory per device (multiple of 2MiB; sim commits it lazily)")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	flag.Parse()
	if err := run(*listen, *backend, *devices, *memory, *level); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-node:", err)
		os.Exit(1)
	}
}

func run(listen, backend string, devices int, memory, level string) error {
	log, err := daemon.Logger("vgpu-node", level)
	if err != nil {
		return err
	}
	if backend != "sim" {
		return fmt.Errorf("--backend %q: this build has only sim: %w", backend, api.ErrInvalidArgument)
	}
	size, err := api.ParseSize(memory)
	if err != nil {
		return fmt.Errorf("--memory: %w", err)
	}
	node, addr, err := accelerator.StartSim(listen, devices, size, log)
	if err != nil {
		return err
	}
	log.WithFields(map[string]any{"addr": addr.String(), "devices": devices, "memory": api.FormatSize(size)}).Info("serving")
	daemon.RunUntilStopped(log, func() error { return nil }) // a node has nothing to reload
	return node.Close()
}
