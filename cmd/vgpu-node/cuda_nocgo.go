//go:build !cgo

package main

import (
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
)

// openCUDA, without cgo: NVML (github.com/NVIDIA/go-nvml) needs it, so a
// static vgpu-node serves sim only and says so.
func openCUDA(string, uint64, cudaKernels, logrus.FieldLogger) ([]accelerator.Device, error) {
	return nil, fmt.Errorf("--backend cuda: this vgpu-node was built without cgo (CGO_ENABLED=0), which NVML needs; build it with cgo, as make build does: %w", api.ErrUnavailable)
}
