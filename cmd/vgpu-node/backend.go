package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
)

// startNode starts a node of --backend's --devices, each of size bytes,
// serving on --listen.
func (o *options) startNode(size uint64, opts accelerator.SimOptions, log logrus.FieldLogger) (*accelerator.Node, net.Addr, error) {
	if o.backend == "cuda" {
		devs, err := openCUDA(o.devices, size, o.kernels, log)
		if err != nil {
			return nil, nil, err
		}
		return accelerator.StartWith(o.listen, "cuda", devs, opts, log)
	}
	n, err := simCount(o.devices)
	if err != nil {
		return nil, nil, err
	}
	return accelerator.StartSimWith(o.listen, n, size, opts, log)
}

// cudaKernels are the flags that say where a cuda node's kernels run.
type cudaKernels struct {
	mode   string // --kernels: gpu or host
	cache  string // --kernel-cache: a directory, "" for the default, or off
	nvrtc  string // --nvrtc: libnvrtc's path, or "" to search
	cublas string // --cublas: libcublas's path, "" to search, or off
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
