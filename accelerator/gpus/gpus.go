// Package gpus discovers a host's NVIDIA GPUs and reads their telemetry
// through NVML (github.com/NVIDIA/go-nvml), for the node's cuda backend:
// which GPUs there are (index, UUID, name, memory, PCI bus id, MIG mode),
// which of them --devices selects, and how busy, full, hot and healthy each
// is now (utilization, memory used, temperature, power, ECC errors).
//
// It is the only package of vgpu that imports go-nvml, which needs cgo and
// loads libnvidia-ml.so.1 at run time: binaries that must stay static
// (vgpu-smi, vgpu-hook) never import it, and a host without the driver
// builds and runs everything else. Without the driver Open fails at once
// with an error that names the missing library.
//
// Invariants: a Host's GPU list is read once, at Open, in NVML's index
// order, and does not change; a GPU lost afterwards shows as an error of
// its telemetry (api.ErrUnavailable), not as a shorter list. A Host is safe
// for concurrent use (NVML is thread safe; the Host keeps no mutable state
// after Open).
package gpus

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpu/vgpu/api"
)

// Library is the NVML library file the driver installs.
const Library = "libnvidia-ml.so.1"

// MIGMode is whether a GPU is partitioned into MIG instances.
type MIGMode int

const (
	MIGUnsupported MIGMode = iota // the GPU has no MIG (before A100, or consumer boards)
	MIGDisabled
	MIGEnabled
)

func (m MIGMode) String() string {
	switch m {
	case MIGDisabled:
		return "disabled"
	case MIGEnabled:
		return "enabled"
	}
	return "unsupported"
}

// GPU describes one GPU of the host.
type GPU struct {
	Index    int    // NVML's index, which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID
	UUID     string // "GPU-…", stable across reboots and reorderings
	Name     string // "NVIDIA H200"
	Memory   uint64 // bytes of device memory
	PCIBusID string // "00000000:19:00.0"
	MIG      MIGMode
}

// Telemetry is one reading of a GPU's state.
type Telemetry struct {
	Utilization     uint32 // percent of the last sample period in which a kernel ran
	MemoryUsed      uint64 // bytes, by every process on the GPU
	TemperatureC    uint32 // degrees Celsius, of the die
	PowerMilliwatts uint32
	// ECCCorrected and ECCUncorrected count memory errors since the driver
	// loaded (NVML's volatile counters).
	ECCCorrected, ECCUncorrected uint64
	// Unsupported names the readings this GPU does not offer (ECC with ECC
	// off, power on some boards); their fields are zero.
	Unsupported []string
}

// Host is the NVML view of this host's GPUs. Close it when done.
type Host struct {
	lib     nvml.Interface
	gpus    []GPU
	handles []nvml.Device
}

// Open initialises NVML from the driver's library and lists the GPUs.
func Open() (*Host, error) { return OpenLibrary(nvml.New()) }

// OpenLibrary is Open with an NVML implementation of the caller's: the
// real library (nvml.New), or in tests go-nvml's mock.
func OpenLibrary(lib nvml.Interface) (*Host, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("NVML: %s not found: no NVIDIA driver is installed on this host, or its libraries are not on the loader's path: %w",
			Library, api.ErrUnavailable)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("NVML: %s is installed but the NVIDIA kernel driver is not loaded (%v): %w", Library, ret, api.ErrUnavailable)
	default:
		return nil, fmt.Errorf("NVML: initialise %s: %v: %w", Library, ret, api.ErrUnavailable)
	}
	h := &Host{lib: lib}
	if err := h.list(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	return h, nil
}

func (h *Host) list() error {
	n, ret := h.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: count GPUs: %v: %w", ret, api.ErrUnavailable)
	}
	for i := range n {
		d, ret := h.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %d: %v: %w", i, ret, api.ErrUnavailable)
		}
		g, err := describe(i, d)
		if err != nil {
			return err
		}
		h.gpus = append(h.gpus, g)
		h.handles = append(h.handles, d)
	}
	return nil
}

// describe reads what does not change while the driver runs.
func describe(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i}
	var ret nvml.Return
	fail := func(what string) (GPU, error) {
		return GPU{}, fmt.Errorf("NVML: GPU %d: %s: %v: %w", i, what, ret, api.ErrUnavailable)
	}
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return fail("UUID")
	}
	if g.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return fail("name")
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("memory")
	}
	g.Memory = mem.Total
	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("PCI info")
	}
	g.PCIBusID = cString(pci.BusId[:])
	current, _, ret := d.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		g.MIG = MIGUnsupported
	case ret != nvml.SUCCESS:
		return fail("MIG mode")
	case current == nvml.DEVICE_MIG_ENABLE:
		g.MIG = MIGEnabled
	default:
		g.MIG = MIGDisabled
	}
	return g, nil
}

// cString is the NUL-terminated string in b.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// GPUs lists the host's GPUs by index. The slice is the caller's.
func (h *Host) GPUs() []GPU { return slices.Clone(h.gpus) }

// Select returns the GPUs that sel names, in its order: "" or "all" for
// every GPU, else a comma-separated list of indexes and UUIDs ("0,2",
// "GPU-5b4c…"). A selector that names no GPU, or one named twice, is an
// error wrapping api.ErrInvalidArgument that names it.
func (h *Host) Select(sel string) ([]GPU, error) {
	if sel == "" || sel == "all" {
		if len(h.gpus) == 0 {
			return nil, fmt.Errorf("NVML lists no GPU on this host: %w", api.ErrUnavailable)
		}
		return h.GPUs(), nil
	}
	var out []GPU
	seen := map[int]string{}
	for _, item := range strings.Split(sel, ",") {
		item = strings.TrimSpace(item)
		i, err := h.find(item)
		if err != nil {
			return nil, fmt.Errorf("devices %q: %w", sel, err)
		}
		if prev, ok := seen[i]; ok {
			return nil, fmt.Errorf("devices %q: %q and %q are the same GPU %d: %w", sel, prev, item, i, api.ErrInvalidArgument)
		}
		seen[i] = item
		out = append(out, h.gpus[i])
	}
	return out, nil
}

// find returns the index of the GPU item names.
func (h *Host) find(item string) (int, error) {
	if n, err := strconv.Atoi(item); err == nil {
		if n < 0 || n >= len(h.gpus) {
			return 0, fmt.Errorf("GPU index %d: this host has %d GPUs (0 to %d): %w", n, len(h.gpus), len(h.gpus)-1, api.ErrInvalidArgument)
		}
		return n, nil
	}
	for i, g := range h.gpus {
		if strings.EqualFold(g.UUID, item) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%q is neither an index nor the UUID of a GPU of this host (%s): %w", item, h.uuids(), api.ErrInvalidArgument)
}

func (h *Host) uuids() string {
	us := make([]string, len(h.gpus))
	for i, g := range h.gpus {
		us[i] = g.UUID
	}
	if len(us) == 0 {
		return "none"
	}
	return strings.Join(us, ", ")
}

// Telemetry reads GPU index's state now. A reading the GPU does not offer
// is listed in Telemetry.Unsupported; any other failure (a GPU fallen off
// the bus) is an error wrapping api.ErrUnavailable.
func (h *Host) Telemetry(index int) (Telemetry, error) {
	if index < 0 || index >= len(h.handles) {
		return Telemetry{}, fmt.Errorf("GPU index %d: this host has %d GPUs: %w", index, len(h.handles), api.ErrInvalidArgument)
	}
	d := h.handles[index]
	var t Telemetry
	var errs []error
	// check records ret of reading what: unsupported, or an error.
	check := func(what string, ret nvml.Return) {
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			t.Unsupported = append(t.Unsupported, what)
		default:
			errs = append(errs, fmt.Errorf("%s: %v", what, ret))
		}
	}
	u, ret := d.GetUtilizationRates()
	check("utilization", ret)
	t.Utilization = u.Gpu
	mem, ret := d.GetMemoryInfo()
	check("memory", ret)
	t.MemoryUsed = mem.Used
	t.TemperatureC, ret = d.GetTemperature(nvml.TEMPERATURE_GPU)
	check("temperature", ret)
	t.PowerMilliwatts, ret = d.GetPowerUsage()
	check("power", ret)
	t.ECCCorrected, ret = d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	check("ecc", ret)
	if ret == nvml.SUCCESS {
		t.ECCUncorrected, ret = d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		check("ecc uncorrected", ret)
	}
	if len(errs) > 0 {
		return Telemetry{}, fmt.Errorf("NVML: GPU %d (%s): %w: %w", index, h.gpus[index].UUID, errors.Join(errs...), api.ErrUnavailable)
	}
	return t, nil
}

// Close shuts NVML down.
func (h *Host) Close() error {
	if ret := h.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: shut down: %v: %w", ret, api.ErrInternal)
	}
	return nil
}

// Status is GPU index as node status shows it: what it is, and its
// telemetry now, or the error that kept it from being read.
func (h *Host) Status(index int) *api.GPUStatus {
	if index < 0 || index >= len(h.gpus) {
		return &api.GPUStatus{Index: index, Error: fmt.Sprintf("no GPU %d", index)}
	}
	g := h.gpus[index]
	s := &api.GPUStatus{Index: g.Index, UUID: g.UUID, PCIBusID: g.PCIBusID, MIG: g.MIG.String(), Memory: g.Memory}
	t, err := h.Telemetry(index)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	s.MemoryUsed, s.Utilization, s.TemperatureC, s.PowerMilliwatts = t.MemoryUsed, t.Utilization, t.TemperatureC, t.PowerMilliwatts
	s.ECCCorrected, s.ECCUncorrected, s.Unsupported = t.ECCCorrected, t.ECCUncorrected, t.Unsupported
	return s
}
