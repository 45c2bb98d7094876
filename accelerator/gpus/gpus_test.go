package gpus

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/vgpu/vgpu/accelerator/conformance"
	"github.com/vgpu/vgpu/api"
)

// These tests drive the package through go-nvml's mock package: the mock
// stands in for hardware this machine does not have (a DGX H200's eight
// GPUs, dgxh200), so that everything but the driver's own answers is
// exercised. TestOpenWithoutDriver uses the real library loader; on a GPU
// host, scripts/gpu-check runs these tests against the real driver too.

// h200 returns a mock DGX H200 whose GPUs report PCI bus ids and telemetry
// (the mock server leaves both out), GPU 3 in MIG mode.
func h200(t *testing.T) *server.Server {
	t.Helper()
	s := dgxh200.New()
	for i, d := range s.Devices {
		md := d.(*server.Device)
		bus := []byte("00000000:" + string(rune('1'+i)) + "9:00.0")
		md.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range bus {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		md.MemoryInfo.Used = uint64(i) << 30
		md.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
		}
		md.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return uint32(40 + i), nvml.SUCCESS
		}
		md.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100000 + i), nvml.SUCCESS }
		md.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
			if counter != nvml.VOLATILE_ECC {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if typ == nvml.MEMORY_ERROR_TYPE_CORRECTED {
				return uint64(i), nvml.SUCCESS
			}
			return uint64(2 * i), nvml.SUCCESS
		}
	}
	if ret, _ := s.Devices[3].(*server.Device).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
	return s
}

func open(t *testing.T, lib nvml.Interface) *Host {
	t.Helper()
	h, err := OpenLibrary(lib)
	if err != nil {
		t.Fatalf("OpenLibrary: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestDiscovery(t *testing.T) {
	s := h200(t)
	h := open(t, s)
	gs := h.GPUs()
	if len(gs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gs))
	}
	for i, g := range gs {
		want := s.Devices[i].(*server.Device)
		if g.Index != i || g.UUID != want.UUID || !strings.HasPrefix(g.UUID, "GPU-") || g.Name != "NVIDIA H200 141GB HBM3e" {
			t.Errorf("GPU %d = %+v, want index %d, UUID %s, an H200", i, g, i, want.UUID)
		}
		if g.Memory != want.MemoryInfo.Total || g.Memory < 140<<30 {
			t.Errorf("GPU %d: memory %d, want %d", i, g.Memory, want.MemoryInfo.Total)
		}
		if bus := "00000000:" + string(rune('1'+i)) + "9:00.0"; g.PCIBusID != bus {
			t.Errorf("GPU %d: PCI bus id %q, want %q", i, g.PCIBusID, bus)
		}
		wantMIG := MIGDisabled
		if i == 3 {
			wantMIG = MIGEnabled
		}
		if g.MIG != wantMIG {
			t.Errorf("GPU %d: MIG %v, want %v", i, g.MIG, wantMIG)
		}
	}
}

func TestTelemetry(t *testing.T) {
	h := open(t, h200(t))
	for _, i := range []int{0, 5} {
		tm, err := h.Telemetry(i)
		if err != nil {
			t.Fatalf("Telemetry(%d): %v", i, err)
		}
		want := Telemetry{Utilization: uint32(10 * i), MemoryUsed: uint64(i) << 30, TemperatureC: uint32(40 + i),
			PowerMilliwatts: uint32(100000 + i), ECCCorrected: uint64(i), ECCUncorrected: uint64(2 * i)}
		if tm.Utilization != want.Utilization || tm.MemoryUsed != want.MemoryUsed || tm.TemperatureC != want.TemperatureC ||
			tm.PowerMilliwatts != want.PowerMilliwatts || tm.ECCCorrected != want.ECCCorrected || tm.ECCUncorrected != want.ECCUncorrected ||
			len(tm.Unsupported) != 0 {
			t.Errorf("Telemetry(%d) = %+v, want %+v", i, tm, want)
		}
	}
	_, err := h.Telemetry(8)
	conformance.WantErr(t, "Telemetry(8)", err, api.ErrInvalidArgument, "8")
}

func TestStatus(t *testing.T) {
	s := h200(t)
	h := open(t, s)
	st := h.Status(3)
	want := api.GPUStatus{Index: 3, UUID: s.Devices[3].(*server.Device).UUID, PCIBusID: "00000000:49:00.0", MIG: "enabled",
		Memory: h.GPUs()[3].Memory, MemoryUsed: 3 << 30, Utilization: 30, TemperatureC: 43, PowerMilliwatts: 100003, ECCCorrected: 3, ECCUncorrected: 6}
	if st == nil || st.Error != "" || st.Index != want.Index || st.UUID != want.UUID || st.PCIBusID != want.PCIBusID || st.MIG != want.MIG ||
		st.Memory != want.Memory || st.MemoryUsed != want.MemoryUsed || st.Utilization != want.Utilization || st.TemperatureC != want.TemperatureC ||
		st.PowerMilliwatts != want.PowerMilliwatts || st.ECCCorrected != want.ECCCorrected || st.ECCUncorrected != want.ECCUncorrected {
		t.Errorf("Status(3) = %+v, want %+v", st, want)
	}
	s.Devices[4].(*server.Device).GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
	if st := h.Status(4); st.UUID == "" || !strings.Contains(st.Error, "ERROR_GPU_IS_LOST") || st.TemperatureC != 0 {
		t.Errorf("Status of a lost GPU = %+v, want its identity and the error", st)
	}
	if st := h.Status(9); !strings.Contains(st.Error, "no GPU 9") {
		t.Errorf("Status(9) = %+v", st)
	}
}

func TestTelemetryUnsupportedAndLost(t *testing.T) {
	s := h200(t)
	d1 := s.Devices[1].(*server.Device)
	d1.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d1.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d2 := s.Devices[2].(*server.Device)
	h := open(t, s)
	tm, err := h.Telemetry(1)
	if err != nil {
		t.Fatalf("Telemetry(1): %v", err)
	}
	if strings.Join(tm.Unsupported, ",") != "power,ecc" || tm.TemperatureC != 41 {
		t.Errorf("Telemetry(1) = %+v, want power and ecc unsupported, the rest read", tm)
	}
	// GPU 2 falls off the bus after Open.
	d2.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
	_, err = h.Telemetry(2)
	conformance.WantErr(t, "Telemetry of a lost GPU", err, api.ErrUnavailable, "GPU 2", d2.UUID, "temperature", "ERROR_GPU_IS_LOST")
}

func TestSelect(t *testing.T) {
	s := h200(t)
	h := open(t, s)
	uuid := func(i int) string { return s.Devices[i].(*server.Device).UUID }
	for _, c := range []struct {
		sel  string
		want []int
	}{
		{"", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"all", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"0", []int{0}},
		{"5,2", []int{5, 2}},
		{uuid(6) + ", 1", []int{6, 1}},
		{strings.ToLower(uuid(7)), []int{7}},
	} {
		gs, err := h.Select(c.sel)
		if err != nil {
			t.Errorf("Select(%q): %v", c.sel, err)
			continue
		}
		var got []int
		for _, g := range gs {
			got = append(got, g.Index)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Select(%q) = %v, want %v", c.sel, got, c.want)
		}
	}
	for _, c := range []struct{ sel, names string }{
		{"8", "GPU index 8"},
		{"-1", "GPU index -1"},
		{"GPU-nope", `"GPU-nope"`},
		{"1,x", `"x"`},
		{"2," + uuid(2), `"2"`},
		{"0,,1", `""`},
	} {
		_, err := h.Select(c.sel)
		conformance.WantErr(t, "Select("+c.sel+")", err, api.ErrInvalidArgument, c.names)
	}
}

// TestOpenErrors drives Open's failures through a bare mock.Interface.
func TestOpenErrors(t *testing.T) {
	shut := 0
	for _, c := range []struct {
		lib   *mock.Interface
		names []string
	}{
		{&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}, []string{Library, "no NVIDIA driver"}},
		{&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}, []string{"kernel driver is not loaded"}},
		{&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_NO_PERMISSION }}, []string{"ERROR_NO_PERMISSION"}},
		{&mock.Interface{
			InitFunc:           func() nvml.Return { return nvml.SUCCESS },
			ShutdownFunc:       func() nvml.Return { shut++; return nvml.SUCCESS },
			DeviceGetCountFunc: func() (int, nvml.Return) { return 1, nvml.SUCCESS },
			DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) {
				return &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}, nvml.SUCCESS
			},
		}, []string{"GPU 0", "UUID", "ERROR_GPU_IS_LOST"}},
	} {
		_, err := OpenLibrary(c.lib)
		conformance.WantErr(t, "OpenLibrary", err, api.ErrUnavailable, c.names...)
	}
	if shut != 1 {
		t.Errorf("NVML shut down %d times after a failed listing, want 1", shut)
	}
}

// TestOpenWithoutDriver opens the real library: on a host without the
// NVIDIA driver (CI) that fails at once, naming the library.
func TestOpenWithoutDriver(t *testing.T) {
	h, err := Open()
	if err == nil {
		h.Close()
		t.Skip("this host has the NVIDIA driver (TestRealNVML)")
	}
	if os.Getenv("VGPU_REQUIRE_GPU") == "1" {
		t.Fatalf("VGPU_REQUIRE_GPU=1: %v", err)
	}
	conformance.WantErr(t, "Open", err, api.ErrUnavailable, Library)
}

// TestRealNVML reads every GPU of a host with the driver (scripts/gpu-check
// runs it on one; elsewhere it skips).
func TestRealNVML(t *testing.T) {
	h, err := Open()
	if err != nil {
		t.Skipf("no NVIDIA driver: %v", err)
	}
	defer h.Close()
	if len(h.GPUs()) == 0 {
		t.Fatal("NVML opened and lists no GPU")
	}
	for _, g := range h.GPUs() {
		tm, err := h.Telemetry(g.Index)
		if err != nil {
			t.Errorf("GPU %d: %v", g.Index, err)
			continue
		}
		t.Logf("GPU %d %s %q %d bytes, PCI %s, MIG %v: %+v", g.Index, g.UUID, g.Name, g.Memory, g.PCIBusID, g.MIG, tm)
		if g.Memory == 0 || g.PCIBusID == "" || !strings.HasPrefix(g.UUID, "GPU-") || tm.TemperatureC == 0 || tm.TemperatureC > 120 {
			t.Errorf("GPU %d: implausible reading %+v, %+v", g.Index, g, tm)
		}
		if sel, err := h.Select(g.UUID); err != nil || len(sel) != 1 || sel[0].Index != g.Index {
			t.Errorf("Select(%s) = %v, %v", g.UUID, sel, err)
		}
	}
}

// TestStaticBinariesDoNotImportNVML: vgpu-smi and vgpu-hook go into
// containers built static, and go-nvml needs cgo.
func TestStaticBinariesDoNotImportNVML(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil || testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/vgpu/vgpu/cmd/vgpu-smi", "github.com/vgpu/vgpu/cmd/vgpu-hook").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "go-nvml") || strings.Contains(string(out), "accelerator/gpus") {
		t.Errorf("a static binary imports NVML:\n%s", out)
	}
	if !strings.Contains(string(out), "github.com/vgpu/vgpu/api") {
		t.Errorf("go list listed no vgpu package:\n%s", out)
	}
}
