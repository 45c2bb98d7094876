//go:build cgo

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/gpus"
	"github.com/vgpu/vgpu/accelerator/sim"
	"github.com/vgpu/vgpu/internal/fakegpu"
)

// runNode runs this test binary as vgpu-node (TestMain) with args and env,
// and returns its stderr, how long it ran and its exit error.
func runNode(t *testing.T, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "VGPU_NODE_ARGS="+strings.Join(args, " ")), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return stderr.String(), time.Since(start), err
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("vgpu-node %v still running after 20s; stderr:\n%s", args, stderr.String())
		return "", 0, nil
	}
}

// TestCUDABackendWithoutDriver runs vgpu-node --backend cuda on a host
// without the NVIDIA driver: it must fail at once, saying which libraries
// are missing, rather than start a node with no devices.
func TestCUDABackendWithoutDriver(t *testing.T) {
	if _, err := exec.LookPath("nvidia-smi"); err == nil {
		t.Skip("this host has the NVIDIA driver")
	}
	stderr, took, err := runNode(t, nil, "--backend", "cuda", "--listen", "127.0.0.1:0")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1; stderr:\n%s", err, stderr)
	}
	for _, want := range []string{"--backend cuda needs the NVIDIA driver", "libnvidia-ml.so.1 not found", "cannot load libcuda.so.1",
		"NVRTC: cannot load libnvrtc", "--kernels host runs the kernels on the host's CPU instead"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	// Kernels on the host need no NVRTC, and it is not named.
	stderr, _, err = runNode(t, nil, "--backend", "cuda", "--kernels", "host", "--listen", "127.0.0.1:0")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Contains(stderr, "libnvrtc") {
		t.Errorf("--kernels host without a driver: exit %v, want 1 not naming libnvrtc; stderr:\n%s", err, stderr)
	}
	if strings.Contains(stderr, "serving") {
		t.Errorf("the node started serving:\n%s", stderr)
	}
	if took > 10*time.Second {
		t.Errorf("took %v to fail", took)
	}

	// With one of the driver's libraries on the loader's path (the fakes of
	// internal/fakegpu) only the other is missing, and only it is named.
	libs := fakegpu.Build(t)
	for _, tc := range []struct {
		lib, want, not string
	}{
		{libs.CUDA, "libnvidia-ml.so.1 not found", "cannot load libcuda.so.1"},
		{libs.NVML, "cannot load libcuda.so.1", "libnvidia-ml.so.1 not found"},
	} {
		dir := t.TempDir()
		if err := os.Symlink(tc.lib, filepath.Join(dir, filepath.Base(tc.lib))); err != nil {
			t.Fatal(err)
		}
		stderr, took, err := runNode(t, []string{"LD_LIBRARY_PATH=" + dir}, "--backend", "cuda", "--kernels", "host", "--listen", "127.0.0.1:0")
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("exit %v with only %s, want status 1; stderr:\n%s", err, filepath.Base(tc.lib), stderr)
		}
		if !strings.Contains(stderr, tc.want) || strings.Contains(stderr, tc.not) || strings.Contains(stderr, "serving") {
			t.Errorf("with only %s, stderr should say %q and not %q:\n%s", filepath.Base(tc.lib), tc.want, tc.not, stderr)
		}
		if took > 10*time.Second {
			t.Errorf("with only %s, took %v to fail", filepath.Base(tc.lib), took)
		}
	}
}

func TestDevicesFlag(t *testing.T) {
	stderr, _, err := runNode(t, nil, "--devices", "two", "--listen", "127.0.0.1:0")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(stderr, `--devices "two": the sim backend takes a number of devices`) {
		t.Errorf("--devices two with sim: exit %v, stderr:\n%s", err, stderr)
	}
	stderr, _, err = runNode(t, nil, "--backend", "tpu", "--listen", "127.0.0.1:0")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(stderr, `--backend "tpu": want sim or cuda`) {
		t.Errorf("--backend tpu: exit %v, stderr:\n%s", err, stderr)
	}
}

// TestNVMLDevice: a cuda device reports its GPU through the NVML host it
// shares with the node's other devices (go-nvml's mock of a DGX H200 stands
// in for the hardware), which is shut down once, after the last device
// closed, however often each is closed.
func TestNVMLDevice(t *testing.T) {
	s := dgxh200.New()
	shutdowns := 0
	s.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
	for _, d := range s.Devices {
		// The mock server has no telemetry: this GPU offers none but its
		// utilization.
		md := d.(*server.Device)
		md.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 55}, nvml.SUCCESS }
		md.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		md.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		md.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
	}
	host, err := gpus.OpenLibrary(s)
	if err != nil {
		t.Fatal(err)
	}
	shared := &sharedHost{host: host, refs: 1}
	var devs []*nvmlDevice
	for i := range 2 {
		sd, err := sim.New(uint32(i), accelerator.FrameSize)
		if err != nil {
			t.Fatal(err)
		}
		shared.retain()
		devs = append(devs, &nvmlDevice{Device: sd, nvml: shared, gpu: 5 + i})
	}
	shared.release()
	st := devs[1].GPUStatus()
	if st.Index != 6 || st.UUID != s.Devices[6].(*server.Device).UUID || st.Error != "" || st.Utilization != 55 || len(st.Unsupported) != 3 {
		t.Errorf("GPUStatus() = %+v, want GPU 6 with its readings", st)
	}
	for _, d := range devs {
		d.Close()
		d.Close()
		if d == devs[0] && shutdowns != 0 {
			t.Errorf("NVML shut down while a device still reports through it")
		}
	}
	if shutdowns != 1 {
		t.Errorf("NVML shut down %d times, want once", shutdowns)
	}
}

// TestKernelCacheDir: --kernel-cache names the directory, off none, and by
// default it is under $XDG_CACHE_HOME (else ~/.cache); with neither the
// node compiles at every start and warns.
func TestKernelCacheDir(t *testing.T) {
	log, hook := test.NewNullLogger()
	t.Setenv("XDG_CACHE_HOME", "/var/cache/x")
	for flag, want := range map[string]string{"/srv/k": "/srv/k", "off": "", "": "/var/cache/x/vgpu/kernels"} {
		if got := kernelCacheDir(flag, log); got != want {
			t.Errorf("--kernel-cache %q: %q, want %q", flag, got, want)
		}
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got := kernelCacheDir("", log); got != "" || len(hook.AllEntries()) != 1 || hook.LastEntry().Level != logrus.WarnLevel {
		t.Errorf("without XDG_CACHE_HOME and HOME: %q and %d log entries, want none and a warning", got, len(hook.AllEntries()))
	}
}
