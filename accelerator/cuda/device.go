package cuda

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// FrameSize is the node's frame, each of which is one physical allocation
// here. It must be a multiple of the driver's allocation granularity
// (2 MiB on every GPU with VMM).
const FrameSize = accelerator.FrameSize

// stagingChunk is the size of each half of a device's pinned staging
// buffer: a copy moves through it in chunks, filling one half while the
// other is on its way over PCIe.
const stagingChunk = 1 << 20

// scrubPage is the alignment Scrub asks of its range, as the sim backend
// does, so that the node's contract is one for every backend.
const scrubPage = 4096

// Device is one GPU as the node drives it (accelerator.Device): device
// memory is size bytes of device virtual addresses, reserved at open, each
// FrameSize of it backed by its own physical allocation (cuMemCreate)
// mapped there (cuMemMap, cuMemSetAccess) and zeroed, so the node's frame
// table is the device's. Scrub zeroes with cuMemsetD8 and waits for it,
// checking both. Writes go through pinned staging memory on two streams, so
// that filling one half (from the socket, for WriteFrom) overlaps the
// transfer of the other. Copies stay on the device unless they
// overlap.
//
// Kernels: once UseKernels has loaded the catalog compiled for the GPU
// (kernels/*.cu, compile.go), launches run there, in grid ranges
// (launch.go); before, or if the node chose host kernels, they run the
// catalog's Go implementations on the host over copies of their buffers,
// gathered from the device and written back by finish. Either way a written
// buffer may not overlap another buffer argument other than exactly (the
// same extents): GPU threads would race on it, and copies would hide it.
//
// Concurrency: the node calls a device from several connections at once;
// mu serialises the driver calls, which share the staging buffer and
// streams. Lock order: mu is a leaf.
type Device struct {
	info    api.DeviceInfo
	ctx     *Context
	base    uint64   // device address of the node's address 0
	frames  []uint64 // physical allocation of each frame, mapped at base+i*FrameSize
	ordinal int      // the GPU's CUDA ordinal
	// funcs are the kernels of module by name, and blas the cuBLAS handle
	// matmul uses if any: each written once, by UseKernels and UseCUBLAS
	// before the device serves, and read without mu after.
	funcs map[string]Function
	blas  *cublasHandle

	mu      sync.Mutex // guards everything below, and every driver call
	pin     *Pinned    // 2*stagingChunk
	streams [2]Stream  // one per half of pin; launches use streams[0]
	closed  bool
	module  Module          // the compiled catalog, 0 until UseKernels
	scratch map[uint64]bool // launches' scratch allocations not yet freed
}

// New opens device index of the node on the driver's GPU ordinal, with size
// bytes of memory (a multiple of FrameSize), all of it allocated, mapped
// and zeroed now. name names it in status.
func New(drv *Driver, ordinal int, index uint32, size uint64, name string) (dev *Device, err error) {
	if size == 0 || size%FrameSize != 0 {
		return nil, fmt.Errorf("cuda device %d: memory %d is not a positive multiple of %d bytes: %w", index, size, FrameSize, api.ErrInvalidArgument)
	}
	ctx, err := drv.Retain(ordinal)
	if err != nil {
		return nil, err
	}
	d := &Device{info: api.DeviceInfo{Index: index, Name: name, Memory: size}, ctx: ctx, ordinal: ordinal, scratch: map[uint64]bool{}}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("cuda device %d (GPU %d): %w", index, ordinal, err), d.Close())
			dev = nil
		}
	}()
	err = ctx.Do(func(k *Calls) error {
		g, err := k.Granularity()
		if err != nil {
			return err
		}
		if g == 0 || FrameSize%g != 0 {
			return fmt.Errorf("allocation granularity %d does not divide the %d-byte frame: %w", g, FrameSize, api.ErrUnavailable)
		}
		if d.base, err = k.Reserve(size, FrameSize); err != nil {
			return err
		}
		for i := uint64(0); i < size/FrameSize; i++ {
			h, err := k.Create(FrameSize)
			if err != nil {
				return fmt.Errorf("frame %d of %d: %w", i, size/FrameSize, err)
			}
			if err := k.Map(d.base+i*FrameSize, FrameSize, h); err != nil {
				return errors.Join(fmt.Errorf("frame %d: %w", i, err), k.Release(h))
			}
			d.frames = append(d.frames, h)
		}
		// Physical memory comes with whatever it held.
		if err := k.Memset(d.base, 0, size); err != nil {
			return err
		}
		if err := k.Synchronize(); err != nil {
			return err
		}
		if d.pin, err = k.HostAlloc(2 * stagingChunk); err != nil {
			return err
		}
		for i := range d.streams {
			if d.streams[i], err = k.NewStream(); err != nil {
				return err
			}
		}
		return nil
	})
	return d, err
}

// Info describes the device.
func (d *Device) Info() api.DeviceInfo { return d.info }

// Close frees everything the device holds on the GPU and releases its
// context. Closing twice is harmless.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	err := d.ctx.Do(func(k *Calls) error {
		var errs []error
		for p := range d.scratch {
			errs = append(errs, k.Free(p))
		}
		clear(d.scratch)
		if d.blas != nil {
			errs = append(errs, d.blas.destroy())
			d.blas = nil
		}
		if d.module != 0 {
			errs = append(errs, k.Unload(d.module))
			d.module = 0
		}
		for i, s := range d.streams {
			if s != 0 {
				errs = append(errs, k.Sync(s), k.DestroyStream(s))
				d.streams[i] = 0
			}
		}
		if d.pin != nil {
			errs = append(errs, k.FreeHost(d.pin))
		}
		for i, h := range d.frames {
			errs = append(errs, k.Unmap(d.base+uint64(i)*FrameSize, FrameSize), k.Release(h))
		}
		d.frames = nil
		if d.base != 0 {
			errs = append(errs, k.FreeAddress(d.base, d.info.Memory))
		}
		return errors.Join(errs...)
	})
	return errors.Join(err, d.ctx.Release())
}

// do runs fn with the context current and the device's lock held.
func (d *Device) do(fn func(*Calls) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%s: closed: %w", d.info.Name, api.ErrUnavailable)
	}
	return d.ctx.Do(fn)
}

// check checks that every extent lies in memory.
func (d *Device) check(xs []api.Extent) error {
	for _, x := range xs {
		if x.Addr > d.info.Memory || x.Len > d.info.Memory-x.Addr {
			return fmt.Errorf("%s: extent [%#x, +%d) outside %d bytes of memory: %w", d.info.Name, x.Addr, x.Len, d.info.Memory, api.ErrInvalidAddress)
		}
	}
	return nil
}

// upload moves the extents' bytes to the device in chunks through the
// staging halves: fill puts the next len(buf) bytes into buf. The halves
// alternate, each waited for before it is refilled, so filling one
// overlaps the transfer of the other.
func (d *Device) upload(k *Calls, xs []api.Extent, fill func(buf []byte) error) error {
	half := 0
	var err error
	for _, x := range xs {
		for off := uint64(0); off < x.Len && err == nil; {
			n := int(min(x.Len-off, stagingChunk))
			if err = k.Sync(d.streams[half]); err != nil {
				break
			}
			if err = fill(d.pin.Bytes()[half*stagingChunk : half*stagingChunk+n]); err != nil {
				break
			}
			if err = k.HtoDAsync(d.base+x.Addr+off, d.pin, half*stagingChunk, n, d.streams[half]); err != nil {
				break
			}
			off += uint64(n)
			half ^= 1
		}
	}
	// Whatever happened, nothing may be in flight from the staging memory
	// when the next call refills it.
	return errors.Join(err, k.Sync(d.streams[0]), k.Sync(d.streams[1]))
}

// download copies the extents' bytes into out, in order, through staging.
func (d *Device) download(k *Calls, xs []api.Extent, out []byte) error {
	s := d.streams[0]
	for _, x := range xs {
		for off := uint64(0); off < x.Len; {
			n := int(min(x.Len-off, 2*stagingChunk))
			if err := k.DtoHAsync(d.pin, 0, n, d.base+x.Addr+off, s); err != nil {
				return errors.Join(err, k.Sync(s))
			}
			if err := k.Sync(s); err != nil {
				return err
			}
			out = out[copy(out, d.pin.Bytes()[:n]):]
			off += uint64(n)
		}
	}
	return nil
}

// Write scatters p over xs, whose lengths must add up to len(p).
func (d *Device) Write(xs []api.Extent, p []byte) error {
	if n := api.ExtentsLen(xs); n != uint64(len(p)) {
		return fmt.Errorf("%s: write of %d bytes into extents of %d: %w", d.info.Name, len(p), n, api.ErrInvalidArgument)
	}
	if err := d.check(xs); err != nil {
		return err
	}
	return d.do(func(k *Calls) error {
		return d.upload(k, xs, func(buf []byte) error {
			p = p[copy(buf, p):]
			return nil
		})
	})
}

// WriteFrom fills xs with exactly their total length of bytes read from r,
// which go from the socket straight into pinned memory. Every extent is
// checked before the first byte is read.
func (d *Device) WriteFrom(xs []api.Extent, r io.Reader) error {
	if err := d.check(xs); err != nil {
		return err
	}
	return d.do(func(k *Calls) error {
		return d.upload(k, xs, func(buf []byte) error {
			if _, err := io.ReadFull(r, buf); err != nil {
				return fmt.Errorf("%s: write from the connection: %w", d.info.Name, err)
			}
			return nil
		})
	})
}

// gather returns a copy of the bytes of xs, 8-byte aligned for kernels'
// typed views.
func (d *Device) gather(xs []api.Extent) ([]byte, error) {
	if err := d.check(xs); err != nil {
		return nil, err
	}
	// Extents may repeat: bound the total before allocating it.
	var n uint64
	for _, x := range xs {
		if n += x.Len; n > d.info.Memory {
			return nil, fmt.Errorf("%s: %d extents hold more than the %d bytes of device memory: %w", d.info.Name, len(xs), d.info.Memory, api.ErrInvalidArgument)
		}
	}
	out := make([]byte, n, (n+7)&^7)
	return out, d.do(func(k *Calls) error { return d.download(k, xs, out) })
}

// Read copies the memory of xs to the host and hands it, in order, to send.
func (d *Device) Read(xs []api.Extent, send func(parts ...[]byte) error) error {
	buf, err := d.gather(xs)
	if err != nil {
		return err
	}
	parts := make([][]byte, len(xs))
	for i, x := range xs {
		parts[i], buf = buf[:x.Len], buf[x.Len:]
	}
	return send(parts...)
}

// Fill sets every byte of xs to v.
func (d *Device) Fill(xs []api.Extent, v byte) error {
	if err := d.check(xs); err != nil {
		return err
	}
	return d.do(func(k *Calls) error {
		for _, x := range xs {
			if x.Len == 0 {
				continue
			}
			if err := k.Memset(d.base+x.Addr, v, x.Len); err != nil {
				return err
			}
		}
		return nil
	})
}

// Copy copies src to dst with memmove semantics: on the device
// (cuMemcpyDtoD) piece by piece when no destination byte is a source
// byte, else through host memory (the source read whole before the
// destination is written).
func (d *Device) Copy(dst, src []api.Extent) error {
	if a, b := api.ExtentsLen(dst), api.ExtentsLen(src); a != b {
		return fmt.Errorf("%s: copy of %d bytes into %d: %w", d.info.Name, b, a, api.ErrInvalidArgument)
	}
	if err := d.check(dst); err != nil {
		return err
	}
	if err := d.check(src); err != nil {
		return err
	}
	if !api.ExtentsOverlap(dst, src) {
		return d.do(func(k *Calls) error {
			for i, j, di, sj := 0, 0, uint64(0), uint64(0); i < len(dst) && j < len(src); {
				// di, sj: bytes of dst[i], src[j] done.
				n := min(dst[i].Len-di, src[j].Len-sj)
				if n > 0 {
					if err := k.DtoD(d.base+dst[i].Addr+di, d.base+src[j].Addr+sj, n); err != nil {
						return err
					}
				}
				if di += n; di == dst[i].Len {
					i, di = i+1, 0
				}
				if sj += n; sj == src[j].Len {
					j, sj = j+1, 0
				}
			}
			return nil
		})
	}
	tmp, err := d.gather(src)
	if err != nil {
		return err
	}
	return d.Write(dst, tmp)
}

// Scrub zeroes [addr, addr+n) with cuMemsetD8 and waits for the device to
// have done it, so that a frame handed to another tenant never shows the
// last one's bytes. addr and n must be page aligned (n may also run to the
// end of memory).
func (d *Device) Scrub(addr, n uint64) error {
	if err := d.check([]api.Extent{{Addr: addr, Len: n}}); err != nil {
		return err
	}
	if addr%scrubPage != 0 || n%scrubPage != 0 && addr+n != d.info.Memory {
		return fmt.Errorf("%s: scrub [%#x, +%d): not aligned to %d-byte pages: %w", d.info.Name, addr, n, scrubPage, api.ErrInvalidArgument)
	}
	if n == 0 {
		return nil
	}
	return d.do(func(k *Calls) error {
		if err := k.Memset(d.base+addr, 0, n); err != nil {
			return fmt.Errorf("%s: scrub [%#x, +%d): %w", d.info.Name, addr, n, err)
		}
		if err := k.Synchronize(); err != nil {
			return fmt.Errorf("%s: scrub [%#x, +%d): %w", d.info.Name, addr, n, err)
		}
		return nil
	})
}

// hostBuffer is a buffer argument gathered to the host for a launch.
type hostBuffer struct {
	xs    []api.Extent
	buf   []byte
	write bool
}

// Prepare readies a launch of k, on the GPU once UseKernels has loaded the
// kernels (prepareGPU), else on the host (prepareHost).
func (d *Device) Prepare(k *kernels.Kernel, args []api.NodeArg, maxWork int) (*kernels.Plan, func() error, error) {
	if d.funcs != nil {
		return d.prepareGPU(k, args, maxWork)
	}
	return d.prepareHost(k, args, maxWork)
}

// prepareHost readies a launch of k on the host over copies of its buffers
// (see Device): it gathers them, the same extents once, checks the
// arguments and writes nothing. finish writes back the buffers k may
// write.
func (d *Device) prepareHost(k *kernels.Kernel, args []api.NodeArg, maxWork int) (*kernels.Plan, func() error, error) {
	ps := k.Info.Params
	vals := make([]kernels.Value, len(args))
	var bufs []*hostBuffer
	for i, a := range args {
		if vals[i] = kernels.Scalar(a); a.Kind != api.ArgBuffer {
			continue
		}
		j := slices.IndexFunc(bufs, func(b *hostBuffer) bool { return slices.Equal(b.xs, a.Extents) })
		if j < 0 {
			buf, err := d.gather(a.Extents)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: argument %d of %s: %w", d.info.Name, i, k.Info.Name, err)
			}
			bufs = append(bufs, &hostBuffer{xs: a.Extents, buf: buf})
			j = len(bufs) - 1
		}
		bufs[j].write = bufs[j].write || i < len(ps) && ps[i].Access >= api.AccessWrite
		vals[i].Buf = bufs[j].buf
	}
	p, err := k.Plan(vals, maxWork)
	if err != nil {
		return nil, nil, err
	}
	if err := disjoint(k.Info.Name, "the cuda backend runs kernels on copies of them", len(bufs), func(i int) ([]api.Extent, bool) {
		return bufs[i].xs, bufs[i].write
	}); err != nil {
		return nil, nil, err
	}
	return p, func() error {
		for _, b := range bufs {
			if b.write {
				if err := d.Write(b.xs, b.buf); err != nil {
					return err
				}
			}
		}
		return nil
	}, nil
}

// disjoint checks that no two of a launch's n distinct buffers (buf gives
// each one's extents and whether the kernel writes it) overlap in device
// memory where one is written; why says what the overlap would break.
func disjoint(kernel, why string, n int, buf func(i int) (xs []api.Extent, write bool)) error {
	for i := range n {
		xi, wi := buf(i)
		for j := i + 1; j < n; j++ {
			if xj, wj := buf(j); (wi || wj) && api.ExtentsOverlap(xi, xj) {
				return fmt.Errorf("%s: buffer arguments overlap in device memory other than exactly, and one is written (%s): %w",
					kernel, why, api.ErrInvalidArgument)
			}
		}
	}
	return nil
}
