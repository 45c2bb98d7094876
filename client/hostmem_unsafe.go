package client

import "unsafe"

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
