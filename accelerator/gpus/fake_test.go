package gpus

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpu/vgpu/internal/fakegpu"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fakegpu.Remove()
	os.Exit(code)
}

// TestFakeNVML opens testdata/fakenvml.c, built by internal/fakegpu, through
// go-nvml's real loader, as vgpu-node's end-to-end tests do (e2e): the
// GPU it describes is the fake libcuda's, and its readings come back
// through go-nvml's structs intact. A fake that answered wrongly would
// fail those tests in ways hard to read; this one says which call. It runs
// in a child process (TestFakeNVMLChild): go-nvml's calls bind to the
// first NVML the process loads, and on a GPU host the other tests here
// read the real one.
func TestFakeNVML(t *testing.T) {
	libs := fakegpu.Build(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeNVMLChild$", "-test.v")
	cmd.Env = append(os.Environ(), "FAKENVML_CHILD="+libs.NVML, "VGPU_FAKE_GPU_MEMORY=100663296") // 96 MiB
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFakeNVMLChild") {
		t.Fatalf("TestFakeNVMLChild: %v\n%s", err, out)
	}
}

func TestFakeNVMLChild(t *testing.T) {
	path := os.Getenv("FAKENVML_CHILD")
	if path == "" {
		t.Skip("run by TestFakeNVML")
	}
	h, err := OpenLibrary(nvml.New(nvml.WithLibraryPath(path)))
	if err != nil {
		t.Fatal(err)
	}
	want := GPU{Index: 0, UUID: "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", Name: "vgpu fake GPU", Memory: 96 << 20,
		PCIBusID: "00000000:19:00.0", MIG: MIGDisabled}
	if g := h.GPUs(); len(g) != 1 || g[0] != want {
		t.Errorf("GPUs() = %+v, want [%+v]", g, want)
	}
	tel, err := h.Telemetry(0)
	if err != nil {
		t.Fatal(err)
	}
	if tel.Utilization != 37 || tel.MemoryUsed != 5<<20 || tel.TemperatureC != 41 || tel.PowerMilliwatts != 123456 ||
		tel.ECCCorrected != 3 || tel.ECCUncorrected != 0 || len(tel.Unsupported) != 0 {
		t.Errorf("Telemetry(0) = %+v, want the fake's readings", tel)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}
