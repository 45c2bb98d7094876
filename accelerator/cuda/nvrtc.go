package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/vgpu/vgpu/api"
)

// NVRTCLibraries are the file names tried, in order, for the CUDA runtime
// compiler when no path is given: the sonames of CUDA 13 and 12, then the
// development link, on the loader's path and then in the toolkit's default
// directory, which the loader's path often lacks.
var NVRTCLibraries = toolkitLibraries("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")

// toolkitDir is where the CUDA toolkit installs its libraries by default.
const toolkitDir = "/usr/local/cuda/lib64/"

// toolkitLibraries is names, then each under toolkitDir.
func toolkitLibraries(names ...string) []string {
	out := slices.Clone(names)
	for _, n := range names {
		out = append(out, toolkitDir+n)
	}
	return out
}

// NVRTC is the loaded runtime compiler library (libnvrtc), opened with
// dlopen like the driver, so that building vgpu-node needs no CUDA
// toolkit.
type NVRTC struct {
	path string

	nvrtcVersion           func(major, minor *int32) int32
	nvrtcGetErrorString    func(r int32) *byte
	nvrtcCreateProgram     func(p *uintptr, src, name *byte, nheaders int32, headers, includes unsafe.Pointer) int32
	nvrtcDestroyProgram    func(p *uintptr) int32
	nvrtcCompileProgram    func(p uintptr, n int32, opts unsafe.Pointer) int32
	nvrtcGetProgramLogSize func(p uintptr, n *uintptr) int32
	nvrtcGetProgramLog     func(p uintptr, log *byte) int32
	nvrtcGetCUBINSize      func(p uintptr, n *uintptr) int32
	nvrtcGetCUBIN          func(p uintptr, out *byte) int32
}

// nvrtcCompilation is NVRTC_ERROR_COMPILATION: the source did not compile,
// and the program's log says why.
const nvrtcCompilation = 6

// LoadNVRTC opens the runtime compiler at path, or when path is empty the
// first of NVRTCLibraries the dynamic loader finds. A host without it gets
// an error wrapping api.ErrUnavailable that names libnvrtc.
func LoadNVRTC(path string) (*NVRTC, error) {
	tries := NVRTCLibraries
	if path != "" {
		tries = []string{path}
	}
	lib, p, errs := dlopenFirst(tries)
	if lib != 0 {
		n := &NVRTC{path: p}
		if missing := bind(lib, []symbol{
			{&n.nvrtcVersion, "nvrtcVersion"},
			{&n.nvrtcGetErrorString, "nvrtcGetErrorString"},
			{&n.nvrtcCreateProgram, "nvrtcCreateProgram"},
			{&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"},
			{&n.nvrtcCompileProgram, "nvrtcCompileProgram"},
			{&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"},
			{&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"},
			{&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"},
			{&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"},
		}); missing != "" {
			return nil, fmt.Errorf("NVRTC %s lacks %s (older than CUDA 11.1?): %w", p, missing, api.ErrUnavailable)
		}
		return n, nil
	}
	return nil, fmt.Errorf("NVRTC: cannot load libnvrtc (tried %s: %s): the CUDA runtime compiler, which the cuda backend needs to build its kernels, is not installed or not on the loader's path: %w",
		strings.Join(tries, ", "), strings.Join(errs, "; "), api.ErrUnavailable)
}

// Path is the library loaded.
func (n *NVRTC) Path() string { return n.path }

// Version is NVRTC's CUDA version, "13.0".
func (n *NVRTC) Version() (string, error) {
	var major, minor int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&major, &minor)); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", major, minor), nil
}

func (n *NVRTC) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	msg := "unknown"
	if s := n.nvrtcGetErrorString(r); s != nil {
		msg = goString(s)
	}
	return fmt.Errorf("%s: %s (%d): %w", call, msg, r, api.ErrInternal)
}

// CompileError is a source NVRTC refused: Log is its compilation log.
type CompileError struct {
	Name string // the program's name, as the log cites it
	Log  string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("NVRTC could not compile %s:\n%s", e.Name, strings.TrimSpace(e.Log))
}

// Unwrap: a kernel source that does not compile is a bug of the build, not
// of a request.
func (e *CompileError) Unwrap() error { return api.ErrInternal }

// Compile compiles CUDA C source, called name in its log, with options
// (--gpu-architecture=sm_NN among them, so the result is a CUBIN for that
// real architecture) and returns the CUBIN. A source that does not compile
// is a *CompileError carrying NVRTC's log.
func (n *NVRTC) Compile(source, name string, options []string) (cubin []byte, err error) {
	csrc, cname := append([]byte(source), 0), append([]byte(name), 0)
	var prog uintptr
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&prog, &csrc[0], &cname[0], 0, nil, nil)); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, n.check("nvrtcDestroyProgram", n.nvrtcDestroyProgram(&prog))) }()
	ptrs := make([]*byte, len(options)+1) // never empty, for &ptrs[0]
	var pin runtime.Pinner                // ptrs, passed to C, points at the options
	defer pin.Unpin()
	for i, o := range options {
		ptrs[i] = &append([]byte(o), 0)[0]
		pin.Pin(ptrs[i])
	}
	if r := n.nvrtcCompileProgram(prog, int32(len(options)), unsafe.Pointer(&ptrs[0])); r != 0 {
		log, lerr := n.log(prog)
		if r == nvrtcCompilation {
			return nil, errors.Join(&CompileError{Name: name, Log: log}, lerr)
		}
		return nil, errors.Join(n.check("nvrtcCompileProgram", r), fmt.Errorf("log: %s", log), lerr)
	}
	var size uintptr
	if err := n.check("nvrtcGetCUBINSize", n.nvrtcGetCUBINSize(prog, &size)); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, fmt.Errorf("NVRTC made an empty CUBIN of %s (options %q): %w", name, options, api.ErrInternal)
	}
	cubin = make([]byte, size)
	if err := n.check("nvrtcGetCUBIN", n.nvrtcGetCUBIN(prog, &cubin[0])); err != nil {
		return nil, err
	}
	return cubin, nil
}

// log is prog's compilation log.
func (n *NVRTC) log(prog uintptr) (string, error) {
	var size uintptr
	if err := n.check("nvrtcGetProgramLogSize", n.nvrtcGetProgramLogSize(prog, &size)); err != nil {
		return "", err
	}
	if size <= 1 {
		return "", nil
	}
	b := make([]byte, size)
	if err := n.check("nvrtcGetProgramLog", n.nvrtcGetProgramLog(prog, &b[0])); err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\x00"), nil
}
