// Package cuda is the node's backend for NVIDIA GPUs: the CUDA driver API,
// loaded at run time (driver.go), a Device over it (device.go), the kernel
// catalog in CUDA C (kernels/*.cu, embedded) built at node start by the
// runtime compiler NVRTC, also loaded at run time (nvrtc.go), cached on
// disk (compile.go), and launched in grid ranges the node's scheduler
// steps (launch.go).
//
// The driver library (libcuda.so.1) is opened with dlopen through
// github.com/ebitengine/purego rather than linked: a vgpu-node binary
// built anywhere runs on hosts without a GPU (where --backend cuda fails
// at once naming the missing library), and nothing of the CUDA toolkit —
// headers, stubs, nvcc — is needed to build it. Each driver entry point is
// a Go function value bound to the library's symbol by name; a library
// that lacks one fails Load naming it.
//
// Invariants:
//   - Every driver call that needs a context runs on an OS thread on which
//     the device's primary context is current (Driver.Do locks the
//     goroutine to its thread and sets the context first): goroutines move
//     between threads, and the driver keeps the current context per thread.
//   - A failed call becomes an *Error naming the call and the driver's
//     code and message, wrapping the api sentinel that says what it means
//     for the request (out of memory, invalid argument, unavailable,
//     internal).
//   - Pointers to Go memory passed to the driver are not kept by it past
//     the call: asynchronous copies use pinned host memory from
//     cuMemHostAlloc (HostAlloc), never Go memory.
//
// The tests run against testdata/fakecuda.c, a fake libcuda that
// internal/fakegpu builds with gcc and that stands in for the hardware and
// driver this machine does not have (with the catalog's CUDA C compiled for
// the host, testdata/fakekernels.cc),
// and testdata/fakenvrtc.c, a fake libnvrtc; on a GPU host scripts/gpu-check
// runs them against the real driver and compiler.
package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/vgpu/vgpu/api"
)

// Library is the file name of the CUDA driver library the NVIDIA driver
// installs.
const Library = "libcuda.so.1"

// Result is a CUresult.
type Result int32

// The results the package tells apart.
const (
	success          Result = 0
	errInvalidValue  Result = 1
	errOutOfMemory   Result = 2
	errNotInit       Result = 3
	errNoDevice      Result = 100
	errInvalidDevice Result = 101
)

// Error is a failed driver call.
type Error struct {
	Call string // "cuMemCreate"
	Code Result
	// Name and Message are the driver's (cuGetErrorName,
	// cuGetErrorString), or empty when it does not know the code.
	Name, Message string
}

func (e *Error) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("%s: CUDA error %d", e.Call, e.Code)
	}
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Message)
}

// Unwrap maps the code onto the api error contract.
func (e *Error) Unwrap() error {
	switch e.Code {
	case errOutOfMemory:
		return api.ErrOutOfMemory
	case errInvalidValue:
		return api.ErrInvalidArgument
	case errNotInit, errNoDevice, errInvalidDevice:
		return api.ErrUnavailable
	}
	return api.ErrInternal
}

// Driver is the loaded driver library.
type Driver struct {
	path string
	lib  uintptr

	cuInit                        func(flags uint32) Result
	cuDriverGetVersion            func(v *int32) Result
	cuDeviceGetCount              func(n *int32) Result
	cuDeviceGet                   func(d *int32, ordinal int32) Result
	cuDeviceGetName               func(name *byte, n int32, d int32) Result
	cuDeviceTotalMem              func(bytes *uintptr, d int32) Result
	cuDeviceGetUuid               func(uuid *[16]byte, d int32) Result
	cuDevicePrimaryCtxRetain      func(ctx *uintptr, d int32) Result
	cuDevicePrimaryCtxRelease     func(d int32) Result
	cuCtxSetCurrent               func(ctx uintptr) Result
	cuCtxSynchronize              func() Result
	cuMemGetAllocationGranularity func(g *uintptr, prop *allocProp, option int32) Result
	cuMemAddressReserve           func(ptr *uint64, size, align uintptr, addr uint64, flags uint64) Result
	cuMemAddressFree              func(ptr uint64, size uintptr) Result
	cuMemCreate                   func(h *uint64, size uintptr, prop *allocProp, flags uint64) Result
	cuMemRelease                  func(h uint64) Result
	cuMemMap                      func(ptr uint64, size, offset uintptr, h uint64, flags uint64) Result
	cuMemUnmap                    func(ptr uint64, size uintptr) Result
	cuMemSetAccess                func(ptr uint64, size uintptr, desc *accessDesc, count uintptr) Result
	cuMemcpyHtoD                  func(dst uint64, src unsafe.Pointer, n uintptr) Result
	cuMemcpyDtoH                  func(dst unsafe.Pointer, src uint64, n uintptr) Result
	cuMemcpyHtoDAsync             func(dst uint64, src unsafe.Pointer, n uintptr, s uintptr) Result
	cuMemcpyDtoHAsync             func(dst unsafe.Pointer, src uint64, n uintptr, s uintptr) Result
	cuMemcpyDtoD                  func(dst, src uint64, n uintptr) Result
	cuMemsetD8                    func(dst uint64, v uint8, n uintptr) Result
	cuStreamCreate                func(s *uintptr, flags uint32) Result
	cuStreamSynchronize           func(s uintptr) Result
	cuStreamDestroy               func(s uintptr) Result
	cuMemHostAlloc                func(p *unsafe.Pointer, n uintptr, flags uint32) Result
	cuMemFreeHost                 func(p unsafe.Pointer) Result
	cuGetErrorString              func(r Result, s **byte) Result
	cuGetErrorName                func(r Result, s **byte) Result
	cuDeviceGetAttribute          func(v *int32, attr int32, d int32) Result
	cuMemAlloc                    func(p *uint64, n uintptr) Result
	cuMemFree                     func(p uint64) Result
	cuModuleLoadData              func(m *uintptr, image unsafe.Pointer) Result
	cuModuleUnload                func(m uintptr) Result
	cuModuleGetFunction           func(f *uintptr, m uintptr, name *byte) Result
	cuLaunchKernel                func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) Result
}

// symbols binds each entry point to its symbol; the versioned names (_v2)
// are the ones cuda.h's macros select for 64-bit sizes.
func (d *Driver) symbols() []symbol {
	return []symbol{
		{&d.cuInit, "cuInit"},
		{&d.cuDriverGetVersion, "cuDriverGetVersion"},
		{&d.cuDeviceGetCount, "cuDeviceGetCount"},
		{&d.cuDeviceGet, "cuDeviceGet"},
		{&d.cuDeviceGetName, "cuDeviceGetName"},
		{&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.cuDeviceGetUuid, "cuDeviceGetUuid"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxSetCurrent, "cuCtxSetCurrent"},
		{&d.cuCtxSynchronize, "cuCtxSynchronize"},
		{&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"},
		{&d.cuMemAddressReserve, "cuMemAddressReserve"},
		{&d.cuMemAddressFree, "cuMemAddressFree"},
		{&d.cuMemCreate, "cuMemCreate"},
		{&d.cuMemRelease, "cuMemRelease"},
		{&d.cuMemMap, "cuMemMap"},
		{&d.cuMemUnmap, "cuMemUnmap"},
		{&d.cuMemSetAccess, "cuMemSetAccess"},
		{&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"},
		{&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
		{&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"},
		{&d.cuMemsetD8, "cuMemsetD8_v2"},
		{&d.cuStreamCreate, "cuStreamCreate"},
		{&d.cuStreamSynchronize, "cuStreamSynchronize"},
		{&d.cuStreamDestroy, "cuStreamDestroy_v2"},
		{&d.cuMemHostAlloc, "cuMemHostAlloc"},
		{&d.cuMemFreeHost, "cuMemFreeHost"},
		{&d.cuGetErrorString, "cuGetErrorString"},
		{&d.cuGetErrorName, "cuGetErrorName"},
		{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"},
		{&d.cuMemFree, "cuMemFree_v2"},
		{&d.cuModuleLoadData, "cuModuleLoadData"},
		{&d.cuModuleUnload, "cuModuleUnload"},
		{&d.cuModuleGetFunction, "cuModuleGetFunction"},
		{&d.cuLaunchKernel, "cuLaunchKernel"},
	}
}

// Load opens the driver library at path (Library when empty: found by the
// dynamic loader's search) and initialises the driver. A host without the
// NVIDIA driver gets an error wrapping api.ErrUnavailable that names the
// library.
func Load(path string) (*Driver, error) {
	if path == "" {
		path = Library
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("CUDA driver: cannot load %s (%v): no NVIDIA driver is installed on this host, or its libraries are not on the loader's path: %w",
			path, err, api.ErrUnavailable)
	}
	d := &Driver{path: path, lib: lib}
	if missing := bind(lib, d.symbols()); missing != "" {
		return nil, fmt.Errorf("CUDA driver %s lacks %s (a driver older than the VMM API, CUDA 10.2?): %w", path, missing, api.ErrUnavailable)
	}
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		purego.Dlclose(lib)
		return nil, fmt.Errorf("CUDA driver %s: %w", path, err)
	}
	return d, nil
}

// symbol is a Go function variable and the library symbol it calls.
type symbol struct {
	fn   any // a pointer to the variable
	name string
}

// bind binds each of syms to lib's symbol, or closes lib and returns the
// name of the first it lacks.
func bind(lib uintptr, syms []symbol) (missing string) {
	for _, s := range syms {
		if _, err := purego.Dlsym(lib, s.name); err != nil {
			purego.Dlclose(lib)
			return s.name
		}
		purego.RegisterLibFunc(s.fn, lib, s.name)
	}
	return ""
}

// dlopenFirst opens the first of paths the dynamic loader finds; tried
// says why each one before failed.
func dlopenFirst(paths []string) (lib uintptr, path string, tried []string) {
	for _, p := range paths {
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			return lib, p, tried
		}
		tried = append(tried, err.Error())
	}
	return 0, "", tried
}

// check turns a result into an error.
func (d *Driver) check(call string, r Result) error {
	if r == success {
		return nil
	}
	e := &Error{Call: call, Code: r}
	var s *byte
	if d.cuGetErrorName(r, &s) == success && s != nil {
		e.Name = goString(s)
	}
	if d.cuGetErrorString(r, &s) == success && s != nil {
		e.Message = goString(s)
	}
	return e
}

// Version is the driver's CUDA version, 1000*major + 10*minor.
func (d *Driver) Version() (int, error) {
	var v int32
	err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v))
	return int(v), err
}

// GPU is a CUDA device as the driver lists it.
type GPU struct {
	Ordinal int
	Name    string
	UUID    string // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML writes it
	Memory  uint64
}

// GPUs lists the driver's devices by ordinal.
func (d *Driver) GPUs() ([]GPU, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	out := make([]GPU, 0, n)
	for i := range n {
		var dev int32
		if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, i)); err != nil {
			return nil, err
		}
		var name [256]byte
		if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
			return nil, err
		}
		var mem uintptr
		if err := d.check("cuDeviceTotalMem", d.cuDeviceTotalMem(&mem, dev)); err != nil {
			return nil, err
		}
		var u [16]byte
		if err := d.check("cuDeviceGetUuid", d.cuDeviceGetUuid(&u, dev)); err != nil {
			return nil, err
		}
		out = append(out, GPU{Ordinal: int(i), Name: goString(&name[0]), UUID: formatUUID(u), Memory: uint64(mem)})
	}
	return out, nil
}

// The CUdevice_attribute values of the compute capability.
const (
	attrComputeMajor = 75
	attrComputeMinor = 76
)

// Arch is GPU ordinal's compute capability as NVRTC names its real
// architecture: "sm_90" for 9.0.
func (d *Driver) Arch(ordinal int) (string, error) {
	var dev, major, minor int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return "", fmt.Errorf("CUDA device %d: %w", ordinal, err)
	}
	if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&major, attrComputeMajor, dev)); err != nil {
		return "", fmt.Errorf("CUDA device %d: compute capability: %w", ordinal, err)
	}
	if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&minor, attrComputeMinor, dev)); err != nil {
		return "", fmt.Errorf("CUDA device %d: compute capability: %w", ordinal, err)
	}
	return fmt.Sprintf("sm_%d%d", major, minor), nil
}

func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// errClosed is returned by a Context's calls after Release.
var errClosed = fmt.Errorf("CUDA context released: %w", api.ErrUnavailable)

// Context is a device's primary context, retained.
type Context struct {
	d       *Driver
	ordinal int32
	ctx     uintptr
}

// Retain retains the primary context of device ordinal.
func (d *Driver) Retain(ordinal int) (*Context, error) {
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return nil, fmt.Errorf("CUDA device %d: %w", ordinal, err)
	}
	c := &Context{d: d, ordinal: dev}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&c.ctx, dev)); err != nil {
		return nil, fmt.Errorf("CUDA device %d: %w", ordinal, err)
	}
	return c, nil
}

// Release releases the primary context. No call may run during or after it.
func (c *Context) Release() error {
	if c.ctx == 0 {
		return nil
	}
	c.ctx = 0
	return c.d.check("cuDevicePrimaryCtxRelease", c.d.cuDevicePrimaryCtxRelease(c.ordinal))
}

// Do runs fn on a thread on which the context is current.
func (c *Context) Do(fn func(*Calls) error) error {
	if c.ctx == 0 {
		return errClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", c.d.cuCtxSetCurrent(c.ctx)); err != nil {
		return err
	}
	return fn(&Calls{d: c.d, dev: c.ordinal})
}

// Calls are the driver calls that need a current context; they are valid
// only inside Context.Do's fn.
type Calls struct {
	d   *Driver
	dev int32
}

// allocProp is CUmemAllocationProp (cuda.h, CUDA 12 and 13): 32 bytes.
type allocProp struct {
	Type                 int32 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	RequestedHandleTypes int32 // none
	LocType              int32 // CU_MEM_LOCATION_TYPE_DEVICE = 1
	LocID                int32 // the device ordinal
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// accessDesc is CUmemAccessDesc: a location and CUmemAccess_flags.
type accessDesc struct {
	LocType int32
	LocID   int32
	Flags   int32 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
}

func (c *Calls) prop() allocProp { return allocProp{Type: 1, LocType: 1, LocID: c.dev} }

// Granularity is the size and alignment of physical allocations and their
// mappings (cuMemGetAllocationGranularity, minimum).
func (c *Calls) Granularity() (uint64, error) {
	p := c.prop()
	var g uintptr
	err := c.d.check("cuMemGetAllocationGranularity", c.d.cuMemGetAllocationGranularity(&g, &p, 0))
	return uint64(g), err
}

// Reserve reserves size bytes of device virtual addresses.
func (c *Calls) Reserve(size, align uint64) (uint64, error) {
	var p uint64
	err := c.d.check("cuMemAddressReserve", c.d.cuMemAddressReserve(&p, uintptr(size), uintptr(align), 0, 0))
	return p, err
}

// FreeAddress returns a reservation, which must be unmapped.
func (c *Calls) FreeAddress(ptr, size uint64) error {
	return c.d.check("cuMemAddressFree", c.d.cuMemAddressFree(ptr, uintptr(size)))
}

// Create allocates size bytes of physical device memory (not zeroed).
func (c *Calls) Create(size uint64) (uint64, error) {
	p := c.prop()
	var h uint64
	err := c.d.check("cuMemCreate", c.d.cuMemCreate(&h, uintptr(size), &p, 0))
	return h, err
}

// Release frees a physical allocation; a mapping of it keeps it until
// unmapped.
func (c *Calls) Release(h uint64) error { return c.d.check("cuMemRelease", c.d.cuMemRelease(h)) }

// Map maps all of allocation h at ptr and lets the device read and write
// it there.
func (c *Calls) Map(ptr, size, h uint64) error {
	if err := c.d.check("cuMemMap", c.d.cuMemMap(ptr, uintptr(size), 0, h, 0)); err != nil {
		return err
	}
	a := accessDesc{LocType: 1, LocID: c.dev, Flags: 3}
	if err := c.d.check("cuMemSetAccess", c.d.cuMemSetAccess(ptr, uintptr(size), &a, 1)); err != nil {
		return errors.Join(err, c.Unmap(ptr, size))
	}
	return nil
}

// Unmap unmaps [ptr, ptr+size).
func (c *Calls) Unmap(ptr, size uint64) error {
	return c.d.check("cuMemUnmap", c.d.cuMemUnmap(ptr, uintptr(size)))
}

// HtoD copies p to device address dst, synchronously.
func (c *Calls) HtoD(dst uint64, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	return c.d.check("cuMemcpyHtoD", c.d.cuMemcpyHtoD(dst, unsafe.Pointer(&p[0]), uintptr(len(p))))
}

// DtoH copies device bytes at src into p, synchronously.
func (c *Calls) DtoH(p []byte, src uint64) error {
	if len(p) == 0 {
		return nil
	}
	return c.d.check("cuMemcpyDtoH", c.d.cuMemcpyDtoH(unsafe.Pointer(&p[0]), src, uintptr(len(p))))
}

// HtoDAsync queues a copy of pinned host memory p to dst on s.
func (c *Calls) HtoDAsync(dst uint64, p *Pinned, off, n int, s Stream) error {
	return c.d.check("cuMemcpyHtoDAsync", c.d.cuMemcpyHtoDAsync(dst, p.at(off, n), uintptr(n), uintptr(s)))
}

// DtoHAsync queues a copy of device bytes at src into pinned memory p on s.
func (c *Calls) DtoHAsync(p *Pinned, off, n int, src uint64, s Stream) error {
	return c.d.check("cuMemcpyDtoHAsync", c.d.cuMemcpyDtoHAsync(p.at(off, n), src, uintptr(n), uintptr(s)))
}

// DtoD copies n device bytes from src to dst, which must not overlap.
func (c *Calls) DtoD(dst, src, n uint64) error {
	return c.d.check("cuMemcpyDtoD", c.d.cuMemcpyDtoD(dst, src, uintptr(n)))
}

// Memset sets n device bytes at dst to v.
func (c *Calls) Memset(dst uint64, v byte, n uint64) error {
	return c.d.check("cuMemsetD8", c.d.cuMemsetD8(dst, v, uintptr(n)))
}

// Synchronize waits for all the context's work, on every stream, and
// returns the first error of any (a fault of a kernel or a memset).
func (c *Calls) Synchronize() error { return c.d.check("cuCtxSynchronize", c.d.cuCtxSynchronize()) }

// Stream is a CUstream.
type Stream uintptr

// NewStream creates a stream that is ordered after the work of the legacy
// default stream (CU_STREAM_DEFAULT), which the synchronous calls (Memset,
// HtoD, DtoH) use: a copy queued on it sees a memset issued before.
func (c *Calls) NewStream() (Stream, error) {
	var s uintptr
	err := c.d.check("cuStreamCreate", c.d.cuStreamCreate(&s, 0))
	return Stream(s), err
}

// Sync waits for everything queued on s.
func (c *Calls) Sync(s Stream) error {
	return c.d.check("cuStreamSynchronize", c.d.cuStreamSynchronize(uintptr(s)))
}

// DestroyStream destroys s.
func (c *Calls) DestroyStream(s Stream) error {
	return c.d.check("cuStreamDestroy", c.d.cuStreamDestroy(uintptr(s)))
}

// Pinned is page-locked host memory the device copies to and from
// asynchronously (cuMemHostAlloc).
type Pinned struct {
	p unsafe.Pointer
	n int
}

// HostAlloc allocates n bytes of pinned host memory.
func (c *Calls) HostAlloc(n int) (*Pinned, error) {
	var p unsafe.Pointer
	if err := c.d.check("cuMemHostAlloc", c.d.cuMemHostAlloc(&p, uintptr(n), 0)); err != nil {
		return nil, err
	}
	return &Pinned{p: p, n: n}, nil
}

// FreeHost frees pinned memory.
func (c *Calls) FreeHost(p *Pinned) error {
	if p.p == nil {
		return nil
	}
	err := c.d.check("cuMemFreeHost", c.d.cuMemFreeHost(p.p))
	p.p = nil
	return err
}

// Alloc allocates n bytes of device memory outside the node's frames
// (cuMemAlloc), for a launch's scratch.
func (c *Calls) Alloc(n uint64) (uint64, error) {
	var p uint64
	err := c.d.check("cuMemAlloc", c.d.cuMemAlloc(&p, uintptr(n)))
	return p, err
}

// Free frees what Alloc allocated.
func (c *Calls) Free(p uint64) error { return c.d.check("cuMemFree", c.d.cuMemFree(p)) }

// Module is a loaded CUmodule; Function a kernel of one.
type (
	Module   uintptr
	Function uintptr
)

// LoadModule loads a compiled image (a CUBIN, or PTX, which the driver
// compiles) into the current context. The driver reads image during the
// call only.
func (c *Calls) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuModuleLoadData: empty image: %w", api.ErrInvalidArgument)
	}
	var m uintptr
	err := c.d.check("cuModuleLoadData", c.d.cuModuleLoadData(&m, unsafe.Pointer(&image[0])))
	return Module(m), err
}

// Unload unloads m.
func (c *Calls) Unload(m Module) error {
	return c.d.check("cuModuleUnload", c.d.cuModuleUnload(uintptr(m)))
}

// Function finds the kernel called name in m.
func (c *Calls) Function(m Module, name string) (Function, error) {
	cname := append([]byte(name), 0)
	var f uintptr
	if err := c.d.check("cuModuleGetFunction", c.d.cuModuleGetFunction(&f, uintptr(m), &cname[0])); err != nil {
		return 0, fmt.Errorf("kernel %s: %w", name, err)
	}
	return Function(f), nil
}

// Launch queues f on s over a 1-D grid of blocks of threads each. args
// are the kernel's arguments, each as the 8 bytes of a long long, a device
// pointer, or a float in the low 4 (kernels.cu's parameter types);
// cuLaunchKernel gets an array of pointers to them and copies them before
// it returns.
func (c *Calls) Launch(f Function, blocks, threads uint32, s Stream, args []uint64) error {
	if len(args) == 0 {
		return fmt.Errorf("cuLaunchKernel: no arguments: %w", api.ErrInvalidArgument)
	}
	vals := slices.Clone(args)
	ptrs := make([]unsafe.Pointer, len(vals))
	var pin runtime.Pinner // ptrs, passed to C, holds pointers to vals
	defer pin.Unpin()
	pin.Pin(&vals[0])
	for i := range vals {
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	return c.d.check("cuLaunchKernel", c.d.cuLaunchKernel(uintptr(f), blocks, 1, 1, threads, 1, 1, 0, uintptr(s), unsafe.Pointer(&ptrs[0]), nil))
}
