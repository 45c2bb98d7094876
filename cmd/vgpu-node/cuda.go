//go:build cgo

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/cuda"
	"github.com/vgpu/vgpu/accelerator/gpus"
	"github.com/vgpu/vgpu/api"
)

// cudaHeadroom is the memory of each GPU a cuda node leaves to the driver
// (its context, streams, pinned staging) when --memory is not given.
const cudaHeadroom = 2 << 30

// openCUDA opens the GPUs --devices selects (all by default) through NVML
// and the CUDA driver, each with size bytes of memory, or when size is 0
// all of its memory but cudaHeadroom, in whole frames, and with --kernels
// gpu builds the kernel catalog for each with NVRTC (or takes it from the
// cache). Without the driver, or NVRTC where it is needed, it fails at
// once, naming each library missing.
func openCUDA(sel string, size uint64, kern cudaKernels, log logrus.FieldLogger) ([]accelerator.Device, error) {
	host, nvmlErr := gpus.Open()
	drv, cudaErr := cuda.Load("")
	var nvrtc *cuda.NVRTC
	var nvrtcErr error
	if kern.mode == "gpu" {
		if nvrtc, nvrtcErr = cuda.LoadNVRTC(kern.nvrtc); nvrtcErr != nil {
			nvrtcErr = fmt.Errorf("%w (--kernels host runs the kernels on the host's CPU instead, without NVRTC)", nvrtcErr)
		}
	}
	if err := errors.Join(nvmlErr, cudaErr, nvrtcErr); err != nil {
		if host != nil {
			host.Close()
		}
		need := fmt.Sprintf("the NVIDIA driver (%s and %s)", gpus.Library, cuda.Library)
		if kern.mode == "gpu" {
			need += " and, for kernels on the GPU, NVRTC (libnvrtc)"
		}
		return nil, fmt.Errorf("--backend cuda needs %s: %w", need, err)
	}
	var compiler *cuda.Compiler
	if nvrtc != nil {
		compiler = cuda.NewCompiler(nvrtc, kernelCacheDir(kern.cache, log))
	}
	blas, err := loadCUBLAS(kern, log)
	if err != nil {
		return nil, err
	}
	shared := &sharedHost{host: host, refs: 1} // openCUDA's reference, dropped on return
	defer shared.release()
	chosen, err := host.Select(sel)
	if err != nil {
		return nil, fmt.Errorf("--devices: %w", err)
	}
	listed, err := drv.GPUs()
	if err != nil {
		return nil, err
	}
	var devs []accelerator.Device
	fail := func(err error) ([]accelerator.Device, error) {
		for _, d := range devs {
			err = errors.Join(err, d.Close())
		}
		return nil, err
	}
	for i, g := range chosen {
		// NVML and CUDA may number GPUs differently (CUDA_DEVICE_ORDER):
		// the UUID is what both agree on.
		ordinal := -1
		for _, c := range listed {
			if strings.EqualFold(c.UUID, g.UUID) {
				ordinal = c.Ordinal
			}
		}
		if ordinal < 0 {
			return fail(fmt.Errorf("GPU %d (%s) is not visible to CUDA (CUDA_VISIBLE_DEVICES? MIG mode %v?): %w", g.Index, g.UUID, g.MIG, api.ErrUnavailable))
		}
		n := size
		if n == 0 {
			n = max(g.Memory, cudaHeadroom+accelerator.FrameSize) - cudaHeadroom
		}
		n = n / accelerator.FrameSize * accelerator.FrameSize
		d, err := cuda.New(drv, ordinal, uint32(i), n, fmt.Sprintf("%s (GPU %d, %s)", g.Name, g.Index, g.UUID))
		if err != nil {
			return fail(err)
		}
		kernels := "host"
		if compiler != nil {
			start := time.Now()
			if err := d.UseKernels(compiler); err != nil {
				return fail(errors.Join(err, d.Close()))
			}
			s := compiler.Stats()
			log.WithFields(logrus.Fields{"gpu": g.Index, "took": time.Since(start).Round(time.Millisecond), "compiled": s.Compiled, "from_cache": s.CacheHits, "nvrtc": nvrtc.Path()}).Info("kernels loaded")
			kernels = "gpu"
			if blas != nil {
				if err := d.UseCUBLAS(blas); err != nil {
					return fail(errors.Join(err, d.Close()))
				}
				kernels = "gpu, matmul by cuBLAS"
			}
		}
		log.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID, "pci": g.PCIBusID, "memory": api.FormatSize(n), "kernels": kernels}).Info("serving GPU")
		shared.retain()
		devs = append(devs, &nvmlDevice{Device: d, nvml: shared, gpu: g.Index})
	}
	return devs, nil
}

// loadCUBLAS loads cuBLAS for matmul as --cublas says: nil if off, or
// kernels run on the host, or none is found where none was named.
func loadCUBLAS(kern cudaKernels, log logrus.FieldLogger) (*cuda.CUBLAS, error) {
	if kern.mode != "gpu" || kern.cublas == "off" {
		return nil, nil
	}
	blas, err := cuda.LoadCUBLAS(kern.cublas)
	if err != nil && kern.cublas != "" {
		return nil, fmt.Errorf("--cublas: %w", err)
	}
	if err != nil {
		log.WithError(err).Info("matmul runs the catalog's kernel: no cuBLAS")
		return nil, nil
	}
	return blas, nil
}

// kernelCacheDir is --kernel-cache: "off" (or "") for none, else the
// directory given, by default vgpu/kernels under the user's cache
// directory ($XDG_CACHE_HOME, else ~/.cache). Without a default (a service
// with no HOME) the node compiles at every start, and says so.
func kernelCacheDir(flag string, log logrus.FieldLogger) string {
	switch flag {
	case "off":
		return ""
	case "":
		dir, err := os.UserCacheDir()
		if err != nil {
			log.WithError(err).Warn("no kernel cache (give --kernel-cache DIR): the kernels are compiled at every start")
			return ""
		}
		return filepath.Join(dir, "vgpu", "kernels")
	}
	return flag
}

// nvmlDevice is a cuda device whose GPU's NVML description and telemetry
// the node shows in status (accelerator's gpuReporter).
type nvmlDevice struct {
	accelerator.Device
	nvml   *sharedHost
	gpu    int // NVML's index
	closed sync.Once
}

func (d *nvmlDevice) GPUStatus() *api.GPUStatus { return d.nvml.host.Status(d.gpu) }

func (d *nvmlDevice) Close() error {
	err := d.Device.Close()
	d.closed.Do(d.nvml.release)
	return err
}

// sharedHost is NVML, open while a device reports through it.
type sharedHost struct {
	host *gpus.Host
	mu   sync.Mutex
	refs int // guarded by mu
}

func (s *sharedHost) retain() {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
}

func (s *sharedHost) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs--; s.refs == 0 {
		s.host.Close()
	}
}
