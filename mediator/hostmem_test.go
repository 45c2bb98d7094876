package mediator_test

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// registerFD registers size bytes of the memfd fd through r and returns
// the region.
func registerFD(r *wire.RPC, fd int, size uint64) (uint32, error) {
	body, err := r.CallFD(api.OpHostRegister, fd, api.Encode(&api.HostRegister{Size: size}))
	var m api.HostRegion
	if err == nil {
		err = api.Decode(body, &m)
	}
	return m.Region, err
}

// A region needs memory behind every page it registers: pages the
// mediator's copies faulted into a hole would be charged to the mediator,
// not to the tenant. A memfd only truncated to its size, or one with a
// hole punched in it, is refused, naming the first hole; a hole past the
// bytes registered does not matter.
func TestHostRegistrationRefusesHoles(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	_, err := registerFD(r, sparseMemfd(t, 1<<20), 1<<20)
	wantErr(t, err, api.ErrInvalidArgument, "hole at offset 0")
	punched := func() int {
		fd := memfd(t, 1<<20, 0)
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 64<<10, 4096); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	_, err = registerFD(r, punched(), 1<<20)
	wantErr(t, err, api.ErrInvalidArgument, "hole at offset 65536")
	if _, err := registerFD(r, punched(), 64<<10); err != nil {
		t.Fatalf("registering the 64 KiB before a hole: %v", err)
	}
}

// Once registered, a region keeps its memory: the mediator seals the memfd
// against hole punching (F_SEAL_FUTURE_WRITE, which leaves the tenant's
// mapping made before writable), so neither fallocate nor madvise takes
// pages from under the mediator's copies, and copies go on.
func TestRegisteredHostMemoryKeepsItsPages(t *testing.T) {
	sys := start(t, 1, 1, 16<<20, 0)
	r := rawTenant(t, sys)
	const n = 1 << 20
	fd := memfd(t, n, 0)
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	region, err := registerFD(r, fd, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 64<<10, 4096); !errors.Is(err, unix.EPERM) {
		t.Fatalf("punching a hole in a registered region: %v, want EPERM", err)
	}
	if err := unix.Madvise(mem[128<<10:132<<10], unix.MADV_REMOVE); !errors.Is(err, unix.EPERM) {
		t.Fatalf("removing pages of a registered region: %v, want EPERM", err)
	}
	if hole, err := unix.Seek(fd, 0, unix.SEEK_HOLE); err != nil || hole != n {
		t.Fatalf("first hole at %d (%v), want none before %d", hole, err, n)
	}
	// The tenant writes through its mapping; copies see it.
	copy(mem, randomBytes(3, n/2))
	body, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: n / 2}))
	if err != nil {
		t.Fatal(err)
	}
	var m api.MallocReply
	if err := api.Decode(body, &m); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op wire.Op
		m  api.CopyHost
	}{
		{api.OpCopyToDeviceHost, api.CopyHost{Addr: m.Addr, Region: region, Len: n / 2}},
		{api.OpCopyFromDeviceHost, api.CopyHost{Addr: m.Addr, Region: region, Off: n / 2, Len: n / 2}},
	} {
		if _, err := r.Call(c.op, nil, api.Encode(&c.m)); err != nil {
			t.Fatalf("%v: %v", c.op, err)
		}
	}
	if !bytes.Equal(mem[:n/2], mem[n/2:]) {
		t.Fatal("bytes copied through the region came back different")
	}
}

// The zeros that end each 1 MiB chunk of a copy from host memory travel as
// a fill, not as bytes, from a page of them on: the device holds exactly
// what was copied (over bytes that were not zero), and the node link
// carries the rest of the bytes and little more.
func TestZerosEndingACopyTravelAsFills(t *testing.T) {
	sys := start(t, 1, 1, 64<<20, 0)
	c := sys.dial(t, "acme", 1)
	const n = 3<<20 + 5000 // three chunks and a short one
	zeros := func(b []byte, from, to int) []byte { clear(b[from:to]); return b }
	for _, tc := range []struct {
		name string
		src  []byte
	}{
		{"data", randomBytes(1, n)},
		{"zeros after the data", zeros(randomBytes(2, n), 1<<20+777, n)},
		{"all zeros", make([]byte, n)},
		{"a chunk of zeros between data", zeros(randomBytes(3, n), 1<<20, 2<<20)},
		{"zeros ending each chunk", zeros(zeros(zeros(randomBytes(4, n), 1<<20-8192, 1<<20), 2<<20-4097, 2<<20), 3<<20-300, 3<<20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, err := c.HostAlloc(n)
			if err != nil {
				t.Fatal(err)
			}
			defer c.HostFree(host)
			copy(host, tc.src)
			p, err := c.Malloc(0, n)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Free(p)
			s := c.Stream()
			s.Memset(p, 0xa5, n)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			before, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			s.CopyToDevice(p, host)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			after, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			back := make([]byte, n)
			s.CopyFromDevice(back, p)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, tc.src) {
				t.Fatal("the device holds other bytes than were copied")
			}
			// The bytes that must travel: each chunk's, less the run of
			// zeros that ends it if that is a page or more.
			var payload uint64
			for off := 0; off < n; off += 1 << 20 {
				chunk := tc.src[off:min(off+1<<20, n)]
				end := len(chunk)
				for end > 0 && chunk[end-1] == 0 {
					end--
				}
				if len(chunk)-end < 4096 {
					end = len(chunk)
				}
				payload += uint64(end)
			}
			if sent := after.NetOut - before.NetOut; sent < payload || sent > payload+1024 || after.CopiedIn-before.CopiedIn != n {
				t.Fatalf("a copy of %d bytes, %d of them to send, sent %d bytes to the node; counted %d copied in",
					n, payload, sent, after.CopiedIn-before.CopiedIn)
			}
		})
	}
}
