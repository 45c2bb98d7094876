// The prelude of the kernel catalog in CUDA C (accelerator/cuda/kernels):
// the node compiles it, followed by every .cu file of this directory in
// name order, as one NVRTC program at start (accelerator/cuda/compile.go).
//
// Every kernel of the catalog (accelerator/kernels) has one entry point here
// of the same name, taking (lo, hi) and then the catalog's parameters in
// the catalog's order: i64 as long long, f32 as float, buffers as pointers.
// The launch is a 1-D grid over work items [lo, hi) (what an item is, each
// kernel says): the node's scheduler slices a launch into grid ranges,
// one cuLaunchKernel per slice (accelerator/cuda/launch.go says how many
// items a slice holds).
//
// Rules, so that the kernels also run on the fake driver, which runs a
// grid one thread after another on the host (testdata/fakekernels.cc):
// no shared memory, no barriers, no warp intrinsics; an item's result
// depends on the inputs only (but for a carried kernel's accumulator,
// launch.go). Sums run in index order and the program is
// compiled without fused multiply-add, so results match the Go references
// closely (the conformance suite's tolerance) and do not depend on the grid.
// Indices read from buffers are checked again here: the node checked them
// before the launch, but a tenant may rewrite them meanwhile, and a kernel
// must never read outside its buffers.

#define VGPU_KERNEL extern "C" __global__ void

// ITEM declares i, the work item of this thread, and returns from threads
// past the end of the range.
#define ITEM(i)                                                                    \
	long long i = lo + (long long)blockIdx.x * blockDim.x + threadIdx.x;       \
	if (i >= hi)                                                               \
		return
