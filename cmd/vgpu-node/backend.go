package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
)

// startNode starts a node of the backend's devices (run's flags).
func startNode(listen, backend, devices string, size uint64, opts accelerator.SimOptions, log logrus.FieldLogger) (*accelerator.Node, net.Addr, error) {
	if backend == "cuda" {
		devs, err := openCUDA(devices, size, log)
		if err != nil {
			return nil, nil, err
		}
		return accelerator.StartWith(listen, "cuda", devs, opts, log)
	}
	n, err := simCount(devices)
	if err != nil {
		return nil, nil, err
	}
	return accelerator.StartSimWith(listen, n, size, opts, log)
}

// simCount reads --devices for the sim backend: a number of devices.
func simCount(v string) (int, error) {
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("--devices %q: the sim backend takes a number of devices: %w", v, api.ErrInvalidArgument)
	}
	return n, nil
}
