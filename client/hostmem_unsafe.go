package client

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// remap moves mapping mem onto a new memfd with the same bytes, at the
// same address, and returns the memfd: for a region the mediator that
// sealed its old memfd (against writable mappings) no longer maps. Bytes
// written to mem meanwhile by another thread may be lost.
func remap(mem []byte) (int, error) {
	fd, err := unix.MemfdCreate("vgpu-host", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd: %w", err)
	}
	err = unix.Ftruncate(fd, int64(len(mem)))
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	}
	var tmp []byte
	if err == nil {
		tmp, err = unix.Mmap(fd, 0, len(mem), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err == nil {
		copy(tmp, mem) // every page written: the mediator refuses holes
		err = unix.Munmap(tmp)
	}
	if err == nil {
		_, err = unix.MmapPtr(fd, 0, unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("move host memory onto a new memfd: %w", err)
	}
	return fd, nil
}

// within reports whether b lies entirely inside mem, and at which offset.
func within(mem, b []byte) (uint64, bool) {
	if len(mem) == 0 || len(b) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base+uintptr(len(b)) > uintptr(len(mem)) {
		return 0, false
	}
	return uint64(p - base), true
}

// sameStart reports whether b starts where mem does.
func sameStart(mem, b []byte) bool {
	return len(mem) > 0 && len(b) > 0 && unsafe.SliceData(mem) == unsafe.SliceData(b)
}
