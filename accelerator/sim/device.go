// Package sim is the simulated accelerator backend: device memory is real
// bytes in host RAM and kernels run on CPU cores.
//
// Device memory is a sparse memory file (memfd) of the device's size,
// mapped shared with MAP_NORESERVE, so a 16 GiB device costs RAM only where
// it has been written. Scrubbing a range punches a hole in the file
// (FALLOC_FL_PUNCH_HOLE), which both zeroes it and frees the RAM.
//
// Aliasing: normally the device's address a maps the file at offset a. Alias
// maps a range of addresses onto another range's file pages instead, so two
// ranges read the same physical memory (the node stores identical sealed
// frames once); Unalias maps the range back onto its own file pages, copying
// the shared bytes into them first if asked. Remapping is one mmap with
// MAP_FIXED, which replaces the old mapping atomically: a reader of the range
// meanwhile sees the old pages or the new, never a hole.
//
// Invariants: every method takes extents the caller has already checked to
// lie inside the device (the node server does that, against its frame table);
// the device itself only re-checks bounds to turn a caller bug into an error
// rather than memory corruption.
package sim

import (
	"bytes"
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Device is one simulated accelerator.
type Device struct {
	info api.DeviceInfo
	fd   int // the memory file
	mem  []byte
}

// New reserves size bytes of lazily committed device memory.
func New(index uint32, size uint64) (*Device, error) {
	if size == 0 || size > 1<<44 {
		return nil, fmt.Errorf("sim device %d: memory size %d out of range (1 B … 16 TiB): %w", index, size, api.ErrInvalidArgument)
	}
	name := fmt.Sprintf("sim%d", index)
	fd, err := unix.MemfdCreate("vgpu-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sim device %d: memory file: %v: %w", index, err, api.ErrOutOfMemory)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sim device %d: size memory file to %d bytes: %v: %w", index, size, err, api.ErrOutOfMemory)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sim device %d: reserve %d bytes: %v: %w", index, size, err, api.ErrOutOfMemory)
	}
	return &Device{info: api.DeviceInfo{Index: index, Name: name, Memory: size}, fd: fd, mem: mem}, nil
}

// Info describes the device.
func (d *Device) Info() api.DeviceInfo { return d.info }

// Close releases the device memory. No other method may run during or after it.
func (d *Device) Close() error {
	if d.mem == nil {
		return nil
	}
	err := unix.Munmap(d.mem)
	if cerr := unix.Close(d.fd); err == nil {
		err = cerr
	}
	d.mem = nil
	return err
}

func (d *Device) slice(x api.Extent) ([]byte, error) {
	if x.Addr > uint64(len(d.mem)) || x.Len > uint64(len(d.mem))-x.Addr {
		return nil, fmt.Errorf("%s: extent [%#x, +%d) outside %d bytes of memory: %w", d.info.Name, x.Addr, x.Len, len(d.mem), api.ErrInvalidAddress)
	}
	return d.mem[x.Addr : x.Addr+x.Len], nil
}

// Write scatters p over xs, whose lengths must add up to len(p).
func (d *Device) Write(xs []api.Extent, p []byte) error {
	if n := api.ExtentsLen(xs); n != uint64(len(p)) {
		return fmt.Errorf("%s: write of %d bytes into extents of %d: %w", d.info.Name, len(p), n, api.ErrInvalidArgument)
	}
	for _, x := range xs {
		s, err := d.slice(x)
		if err != nil {
			return err
		}
		p = p[copy(s, p):]
	}
	return nil
}

// WriteFrom fills xs, in order, with exactly their total length of bytes
// read from r, straight into device memory. Every extent is checked before
// the first byte is read. An error from r is returned wrapped; the extents
// then hold part of the data.
func (d *Device) WriteFrom(xs []api.Extent, r io.Reader) error {
	for _, x := range xs {
		if _, err := d.slice(x); err != nil {
			return err
		}
	}
	for _, x := range xs {
		s, _ := d.slice(x)
		if _, err := io.ReadFull(r, s); err != nil {
			return fmt.Errorf("%s: write into [%#x, +%d): %w", d.info.Name, x.Addr, x.Len, err)
		}
	}
	return nil
}

// Read hands the memory of xs, in order, to send, without copying it.
func (d *Device) Read(xs []api.Extent, send func(parts ...[]byte) error) error {
	parts := make([][]byte, len(xs))
	for i, x := range xs {
		s, err := d.slice(x)
		if err != nil {
			return err
		}
		parts[i] = s
	}
	return send(parts...)
}

// Fill sets every byte of xs to v.
func (d *Device) Fill(xs []api.Extent, v byte) error {
	for _, x := range xs {
		s, err := d.slice(x)
		if err != nil {
			return err
		}
		if v == 0 {
			clear(s)
			continue
		}
		for i := range s {
			s[i] = v
		}
	}
	return nil
}

// Copy copies src to dst with memmove semantics, even when they overlap.
func (d *Device) Copy(dst, src []api.Extent) error {
	if a, b := api.ExtentsLen(dst), api.ExtentsLen(src); a != b {
		return fmt.Errorf("%s: copy of %d bytes into %d: %w", d.info.Name, b, a, api.ErrInvalidArgument)
	}
	if len(dst) == 1 && len(src) == 1 {
		ds, err := d.slice(dst[0])
		if err != nil {
			return err
		}
		ss, err := d.slice(src[0])
		if err != nil {
			return err
		}
		copy(ds, ss)
		return nil
	}
	tmp, err := d.gather(src)
	if err != nil {
		return err
	}
	if len(src) == 1 {
		// gather returned device memory itself, which dst may overlap:
		// scattering from it piece by piece would read bytes already
		// overwritten.
		tmp = bytes.Clone(tmp)
	}
	return d.Write(dst, tmp)
}

// gather returns the bytes of xs as one slice: the device memory itself when
// xs is a single run, else a copy.
func (d *Device) gather(xs []api.Extent) ([]byte, error) {
	if len(xs) == 1 {
		return d.slice(xs[0])
	}
	// Check every extent, and the total against the device's size, before
	// allocating: extents may repeat, and a forged list of them would
	// otherwise make the node allocate without bound.
	var n uint64
	for _, x := range xs {
		if _, err := d.slice(x); err != nil {
			return nil, err
		}
		if n += x.Len; n > uint64(len(d.mem)) {
			return nil, fmt.Errorf("%s: %d extents hold more than the %d bytes of device memory: %w",
				d.info.Name, len(xs), len(d.mem), api.ErrInvalidArgument)
		}
	}
	// A capacity that is a multiple of 8 makes Go's allocator align the copy
	// to 8 bytes, as float and int32 views need.
	out := make([]byte, 0, (n+7)&^7)
	for _, x := range xs {
		s, _ := d.slice(x)
		out = append(out, s...)
	}
	return out, nil
}

// Prepare readies a launch of k to run on the CPU in slices of about
// maxWork element operations (kernels.Kernel.Plan), for whoever decides when
// each slice runs (the node's scheduler): it gathers and checks the
// arguments and writes nothing. A buffer backed by one physical run is
// handed to the kernel in place; one backed by several is gathered into a
// copy. The caller steps the plan to its end, then calls finish, which is
// nil when there is nothing to do: otherwise it scatters back the buffers
// that were gathered from several runs and that k may write. After a slice
// failed, finish must not be called.
func (d *Device) Prepare(k *kernels.Kernel, args []api.NodeArg, maxWork int) (p *kernels.Plan, finish func() error, err error) {
	vals := make([]kernels.Value, len(args))
	var scatter []int
	copied := false // a buffer was gathered from several runs
	for i, a := range args {
		if vals[i] = kernels.Scalar(a); a.Kind != api.ArgBuffer {
			continue
		}
		buf, err := d.gather(a.Extents)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: argument %d of %s: %w", d.info.Name, i, k.Info.Name, err)
		}
		vals[i].Buf = buf
		copied = copied || len(a.Extents) > 1
		if len(a.Extents) > 1 && i < len(k.Info.Params) && k.Info.Params[i].Access >= api.AccessWrite {
			scatter = append(scatter, i)
		}
	}
	if p, err = k.Plan(vals, maxWork); err != nil {
		return nil, nil, err
	}
	if copied {
		// After the kernel's own checks, which come first; those see
		// through buffers used in place.
		if err := checkDisjoint(k, args); err != nil {
			return nil, nil, err
		}
	}
	if len(scatter) == 0 {
		return p, nil, nil
	}
	return p, func() error {
		for _, i := range scatter {
			if err := d.Write(args[i].Extents, vals[i].Buf); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// checkDisjoint refuses a launch of a kernel that runs on several
// goroutines whose output shares device memory with an input. The kernel
// checks that itself on the slices it is given, but a buffer gathered from
// several runs is a copy, which overlaps nothing.
func checkDisjoint(k *kernels.Kernel, args []api.NodeArg) error {
	if !k.Parallel() {
		return nil // serial kernels define overlapping arguments (Kernel.Info.Doc)
	}
	ps := k.Info.Params
	for o, out := range args {
		if out.Kind != api.ArgBuffer || o >= len(ps) || ps[o].Access < api.AccessWrite {
			continue
		}
		for i, in := range args {
			if i != o && in.Kind == api.ArgBuffer && i < len(ps) && api.ExtentsOverlap(out.Extents, in.Extents) {
				return fmt.Errorf("%s: output %s overlaps input %s in device memory; the result would depend on thread scheduling: %w",
					k.Info.Name, ps[o].Name, ps[i].Name, api.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// Scrub zeroes [addr, addr+n) and returns its RAM to the host. addr and n
// must be page aligned (n may also run to the end of memory). The range must
// not be aliased (Alias): scrubbing frees the file pages the range maps.
func (d *Device) Scrub(addr, n uint64) error {
	if _, err := d.slice(api.Extent{Addr: addr, Len: n}); err != nil {
		return err
	}
	// The file loses whole pages: an unaligned end would zero bytes past
	// the range, an unaligned start fails.
	if ps := uint64(unix.Getpagesize()); addr%ps != 0 || n%ps != 0 && addr+n != uint64(len(d.mem)) {
		return fmt.Errorf("%s: scrub [%#x, +%d): not aligned to %d-byte pages: %w", d.info.Name, addr, n, ps, api.ErrInvalidArgument)
	}
	if n == 0 {
		return nil
	}
	if err := d.punch(addr, n); err != nil {
		return fmt.Errorf("%s: scrub [%#x, +%d): %v: %w", d.info.Name, addr, n, err, api.ErrInternal)
	}
	return nil
}

// punch zeroes the file pages [off, off+n) and frees their RAM, in every
// mapping of them.
func (d *Device) punch(off, n uint64) error {
	return unix.Fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n))
}

// checkRange checks that [addr, addr+n) is a non-empty range of whole pages
// of the device.
func (d *Device) checkRange(op string, addr, n uint64) error {
	if _, err := d.slice(api.Extent{Addr: addr, Len: n}); err != nil {
		return err
	}
	if ps := uint64(unix.Getpagesize()); n == 0 || addr%ps != 0 || n%ps != 0 {
		return fmt.Errorf("%s: %s [%#x, +%d): not whole %d-byte pages: %w", d.info.Name, op, addr, n, ps, api.ErrInvalidArgument)
	}
	return nil
}

// remap maps the device addresses [addr, addr+n) onto the memory file at off.
func (d *Device) remap(addr, n, off uint64) error {
	_, err := unix.MmapPtr(d.fd, int64(off), unsafe.Pointer(&d.mem[addr]), uintptr(n),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE|unix.MAP_FIXED)
	return err
}

// Alias makes [dst, dst+n) read and write the physical memory of
// [src, src+n), whose file pages it maps from now on; dst's own pages are
// freed. Both ranges must be whole pages and must not overlap;
// src must not be aliased itself. Until Unalias, a write to either range
// shows in both, and scrubbing src would zero dst too: the caller keeps
// both unchanged (the node aliases only to sealed frames) and unaliases dst
// before src is scrubbed.
func (d *Device) Alias(dst, src, n uint64) error {
	if err := d.checkRange("alias", dst, n); err != nil {
		return err
	}
	if err := d.checkRange("alias source", src, n); err != nil {
		return err
	}
	if dst < src+n && src < dst+n {
		return fmt.Errorf("%s: alias [%#x, +%d) to [%#x, +%d), which overlaps it: %w", d.info.Name, dst, n, src, n, api.ErrInvalidArgument)
	}
	// dst's bytes are replaced anyway: freeing its pages first means that
	// an error leaves it unaliased.
	if err := d.punch(dst, n); err != nil {
		return fmt.Errorf("%s: alias [%#x, +%d): free its pages: %v: %w", d.info.Name, dst, n, err, api.ErrInternal)
	}
	if err := d.remap(dst, n, src); err != nil {
		return fmt.Errorf("%s: alias [%#x, +%d) to %#x: %v: %w", d.info.Name, dst, n, src, err, api.ErrInternal)
	}
	return nil
}

// Unalias maps [dst, dst+n) back onto its own pages of the memory file.
// With keep, they first get the bytes the range shows now (those of the
// range it was aliased to), so readers see no change; without, the range
// reads zeros afterwards. On an error the range stays aliased. Unaliasing a range that is not aliased is
// harmless: keep leaves its bytes, !keep zeroes them.
func (d *Device) Unalias(dst, n uint64, keep bool) error {
	if err := d.checkRange("unalias", dst, n); err != nil {
		return err
	}
	s := d.mem[dst : dst+n]
	if keep {
		for done := 0; done < len(s); {
			w, err := unix.Pwrite(d.fd, s[done:], int64(dst)+int64(done))
			if err != nil {
				return fmt.Errorf("%s: unalias [%#x, +%d): copy: %v: %w", d.info.Name, dst, n, err, api.ErrInternal)
			}
			done += w
		}
	} else if err := d.punch(dst, n); err != nil {
		return fmt.Errorf("%s: unalias [%#x, +%d): zero: %v: %w", d.info.Name, dst, n, err, api.ErrInternal)
	}
	if err := d.remap(dst, n, dst); err != nil {
		return fmt.Errorf("%s: unalias [%#x, +%d): %v: %w", d.info.Name, dst, n, err, api.ErrInternal)
	}
	return nil
}

// Resident returns the bytes of RAM the device's memory holds now: the
// pages of its memory file that exist, however many ranges map each.
func (d *Device) Resident() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return 0, fmt.Errorf("%s: stat memory file: %v: %w", d.info.Name, err, api.ErrInternal)
	}
	return uint64(st.Blocks) * 512, nil
}
