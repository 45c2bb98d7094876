package sim

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

func newDevice(t *testing.T, size uint64) *Device {
	t.Helper()
	d, err := New(0, size)
	if err != nil {
		t.Fatalf("New(0, %d): %v", size, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func wantErr(t *testing.T, what string, err, sentinel error, parts ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: error %v, want %v", what, err, sentinel)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not name %q", what, err, p)
		}
	}
}

// read returns the bytes of xs, copied out of device memory.
func read(t *testing.T, d *Device, xs ...api.Extent) []byte {
	t.Helper()
	var out []byte
	if err := d.Read(xs, func(parts ...[]byte) error {
		for _, p := range parts {
			out = append(out, p...)
		}
		return nil
	}); err != nil {
		t.Fatalf("Read(%v): %v", xs, err)
	}
	return out
}

// launch runs k whole, as a node would in slices: Prepare, every slice,
// then finish.
func launch(d *Device, k *kernels.Kernel, args []api.NodeArg) error {
	p, finish, err := d.Prepare(k, args, math.MaxInt)
	if err != nil {
		return err
	}
	for more := p.Len() > 0; more; {
		if more, err = p.Step(); err != nil {
			return err
		}
	}
	if finish == nil {
		return nil
	}
	return finish()
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13+i>>8)
	}
	return b
}

func TestNewBadSizes(t *testing.T) {
	for _, size := range []uint64{0, 1<<44 + 1, 1 << 63, math.MaxUint64} {
		d, err := New(7, size)
		if d != nil {
			d.Close()
		}
		wantErr(t, fmt.Sprintf("New(7, %d)", size), err, api.ErrInvalidArgument, "device 7", strconv.FormatUint(size, 10))
	}
}

func TestNewInfoAndClose(t *testing.T) {
	d, err := New(3, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := api.DeviceInfo{Index: 3, Name: "sim3", Memory: 1 << 20}
	if got := d.Info(); got != want {
		t.Fatalf("Info() = %+v, want %+v", got, want)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// A closed device has no memory: accesses fail rather than fault.
	wantErr(t, "Fill after Close", d.Fill([]api.Extent{{Addr: 0, Len: 1}}, 1), api.ErrInvalidAddress)
}

func TestNewDevices(t *testing.T) {
	for _, n := range []int{-1, 0, 65} {
		devs, err := NewDevices(n, 1<<20)
		wantErr(t, fmt.Sprintf("NewDevices(%d)", n), err, api.ErrInvalidArgument, strconv.Itoa(n))
		if devs != nil {
			t.Errorf("NewDevices(%d) returned devices with an error", n)
		}
	}
	_, err := NewDevices(2, 0)
	wantErr(t, "NewDevices of 0 bytes", err, api.ErrInvalidArgument)
	devs, err := NewDevices(3, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range devs {
		if info := d.Info(); info.Index != uint32(i) || info.Name != fmt.Sprintf("sim%d", i) || info.Memory != 4<<20 {
			t.Errorf("device %d: %+v", i, info)
		}
		d.Close()
	}
}

// TestBounds: every method refuses extents that leave device memory with
// ErrInvalidAddress naming the extent, and does not fault.
func TestBounds(t *testing.T) {
	const size = 1 << 20
	d := newDevice(t, size)
	ok := api.Extent{Addr: 0, Len: 8}
	launch := func(x api.Extent) error {
		k, err := kernels.Lookup("fill_f32")
		if err != nil {
			t.Fatal(err)
		}
		return launch(d, k, []api.NodeArg{
			{Kind: api.ArgBuffer, Extents: []api.Extent{ok, x}},
			{Kind: api.ArgI64, Bits: 1},
			{Kind: api.ArgF32, Bits: api.F32Bits(1)},
		})
	}
	ops := map[string]func(x api.Extent) error{
		"write":    func(x api.Extent) error { return d.Write([]api.Extent{x}, make([]byte, x.Len)) },
		"read":     func(x api.Extent) error { return d.Read([]api.Extent{ok, x}, func(...[]byte) error { return nil }) },
		"fill":     func(x api.Extent) error { return d.Fill([]api.Extent{x}, 1) },
		"copy dst": func(x api.Extent) error { return d.Copy([]api.Extent{x}, []api.Extent{{Addr: 0, Len: x.Len}}) },
		"copy src": func(x api.Extent) error { return d.Copy([]api.Extent{{Addr: 0, Len: x.Len}}, []api.Extent{x}) },
		"copy gathered src": func(x api.Extent) error {
			return d.Copy([]api.Extent{{Addr: 0, Len: x.Len + 8}}, []api.Extent{ok, x})
		},
		"scrub":  func(x api.Extent) error { return d.Scrub(x.Addr, x.Len) },
		"launch": launch,
	}
	for _, x := range []api.Extent{
		{Addr: size, Len: 4096},
		{Addr: size - 4096, Len: 8192},
		{Addr: size + 4096, Len: 0},
		{Addr: math.MaxUint64 &^ 4095, Len: 4096},
		{Addr: 4096, Len: math.MaxUint64 &^ 4095},
	} {
		for name, op := range ops {
			if x.Len > size && (name == "write" || strings.HasPrefix(name, "copy")) {
				continue // the payload or the other side cannot be that long
			}
			wantErr(t, fmt.Sprintf("%s %+v", name, x), op(x), api.ErrInvalidAddress, fmt.Sprintf("%#x", x.Addr), "sim0")
		}
	}
	// An empty extent at the very end is inside.
	end := api.Extent{Addr: size, Len: 0}
	for name, op := range ops {
		if err := op(end); err != nil && name != "launch" {
			t.Errorf("%s of an empty extent at the end: %v", name, err)
		}
	}
}

func TestWriteRead(t *testing.T) {
	d := newDevice(t, 1<<20)
	xs := []api.Extent{{Addr: 5000, Len: 10}, {Addr: 100, Len: 0}, {Addr: 70000, Len: 300}, {Addr: 0, Len: 3}}
	p := pattern(1, 313)
	if err := d.Write(xs, p); err != nil {
		t.Fatal(err)
	}
	var parts [][]byte
	if err := d.Read(xs, func(ps ...[]byte) error { parts = ps; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(parts) != len(xs) {
		t.Fatalf("Read sent %d parts, want one per extent (%d)", len(parts), len(xs))
	}
	for i, x := range xs {
		if uint64(len(parts[i])) != x.Len {
			t.Fatalf("part %d has %d bytes, want %d", i, len(parts[i]), x.Len)
		}
	}
	if got := bytes.Join(parts, nil); !bytes.Equal(got, p) {
		t.Fatalf("read back %x, want %x", got, p)
	}
	if got := read(t, d, api.Extent{Addr: 5010, Len: 4}); !bytes.Equal(got, make([]byte, 4)) {
		t.Fatalf("write spilled past its extent: %x", got)
	}
	sendErr := errors.New("peer gone")
	if err := d.Read(xs, func(...[]byte) error { return sendErr }); !errors.Is(err, sendErr) {
		t.Fatalf("Read did not return send's error: %v", err)
	}
	for _, n := range []int{312, 314, 0} {
		err := d.Write(xs, make([]byte, n))
		wantErr(t, fmt.Sprintf("write of %d bytes into 313", n), err, api.ErrInvalidArgument, strconv.Itoa(n), "313")
	}
	if got := read(t, d, xs...); !bytes.Equal(got, p) {
		t.Fatal("a refused write changed memory")
	}
}

func TestFill(t *testing.T) {
	d := newDevice(t, 1<<20)
	if err := d.Write([]api.Extent{{Addr: 0, Len: 64}}, pattern(9, 64)); err != nil {
		t.Fatal(err)
	}
	for _, v := range []byte{0xab, 0} {
		if err := d.Fill([]api.Extent{{Addr: 8, Len: 8}, {Addr: 40, Len: 4}}, v); err != nil {
			t.Fatal(err)
		}
		want := pattern(9, 64)
		for _, r := range [][2]int{{8, 16}, {40, 44}} {
			for i := r[0]; i < r[1]; i++ {
				want[i] = v
			}
		}
		if got := read(t, d, api.Extent{Addr: 0, Len: 64}); !bytes.Equal(got, want) {
			t.Fatalf("after fill with %#x: %x, want %x", v, got, want)
		}
	}
}

// TestCopyMemmove: copies behave as if the source were read whole before
// the destination is written, however the extents overlap.
func TestCopyMemmove(t *testing.T) {
	xs := func(pairs ...uint64) []api.Extent {
		var out []api.Extent
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, api.Extent{Addr: pairs[i], Len: pairs[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		dst, src []api.Extent
	}{
		{"disjoint", xs(1000, 64), xs(0, 64)},
		{"forward overlap", xs(4, 60), xs(0, 60)},
		{"backward overlap", xs(0, 60), xs(4, 60)},
		{"same place", xs(16, 32), xs(16, 32)},
		{"empty", xs(16, 0), xs(32, 0)},
		{"gather to one", xs(2, 24), xs(0, 8, 20, 8, 10, 8)},
		{"one to scatter, overlapping", xs(4, 2, 6, 6), xs(0, 8)},
		{"one to scatter, reversed", xs(8, 4, 0, 4), xs(4, 8)},
		{"scatter to scatter", xs(3, 5, 30, 5, 9, 6), xs(0, 6, 33, 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDevice(t, 1<<20)
			orig := pattern(3, 2048)
			all := api.Extent{Addr: 0, Len: uint64(len(orig))}
			if err := d.Write([]api.Extent{all}, orig); err != nil {
				t.Fatal(err)
			}
			// The model: gather the source from the original, scatter it.
			want := bytes.Clone(orig)
			var src []byte
			for _, x := range tc.src {
				src = append(src, orig[x.Addr:x.Addr+x.Len]...)
			}
			for _, x := range tc.dst {
				src = src[copy(want[x.Addr:x.Addr+x.Len], src):]
			}
			if err := d.Copy(tc.dst, tc.src); err != nil {
				t.Fatal(err)
			}
			if got := read(t, d, all); !bytes.Equal(got, want) {
				t.Fatalf("copy %v <- %v:\n got %x\nwant %x", tc.dst, tc.src, got[:64], want[:64])
			}
		})
	}
	d := newDevice(t, 1<<20)
	err := d.Copy(xs(0, 8, 100, 8), xs(50, 15))
	wantErr(t, "copy of 15 bytes into 16", err, api.ErrInvalidArgument, "15", "16")
}

func TestScrub(t *testing.T) {
	ps := uint64(os.Getpagesize())
	size := 16 * ps
	d := newDevice(t, size)
	all := api.Extent{Addr: 0, Len: size}
	orig := pattern(5, int(size))
	if err := d.Write([]api.Extent{all}, orig); err != nil {
		t.Fatal(err)
	}
	if err := d.Scrub(2*ps, 3*ps); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(orig)
	clear(want[2*ps : 5*ps])
	if got := read(t, d, all); !bytes.Equal(got, want) {
		t.Fatal("Scrub did not zero exactly its range")
	}
	// Unaligned ranges would zero whole pages, past what was asked: refused.
	for _, r := range [][2]uint64{{ps + 1, ps}, {ps, ps + 100}, {ps / 2, 10}} {
		wantErr(t, fmt.Sprintf("Scrub(%#x, %d)", r[0], r[1]), d.Scrub(r[0], r[1]), api.ErrInvalidArgument, fmt.Sprintf("%#x", r[0]))
	}
	if err := d.Scrub(ps, 0); err != nil {
		t.Fatalf("empty Scrub: %v", err)
	}
	if got := read(t, d, all); !bytes.Equal(got, want) {
		t.Fatal("refused or empty Scrub changed memory")
	}
	if err := d.Scrub(0, size); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, all); !bytes.Equal(got, make([]byte, size)) {
		t.Fatal("memory not zero after scrubbing all of it")
	}
	// Memory works as before after a scrub.
	if err := d.Write([]api.Extent{all}, orig); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, all); !bytes.Equal(got, orig) {
		t.Fatal("memory lost a write after a scrub")
	}
	// A device whose size is not a page multiple scrubs up to its end.
	odd := newDevice(t, 2*ps+100)
	if err := odd.Fill([]api.Extent{{Addr: 0, Len: 2*ps + 100}}, 7); err != nil {
		t.Fatal(err)
	}
	if err := odd.Scrub(ps, ps+100); err != nil {
		t.Fatalf("scrub to the end of an odd-sized device: %v", err)
	}
	if got := read(t, odd, api.Extent{Addr: ps - 1, Len: ps + 101}); got[0] != 7 || !bytes.Equal(got[1:], make([]byte, ps+100)) {
		t.Fatal("scrub to the end zeroed the wrong bytes")
	}
}

// f32s and f32Bytes convert between device bytes and float32 values.
func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	if _, err := binary.Decode(b, binary.LittleEndian, out); err != nil {
		panic(err)
	}
	return out
}

func f32Bytes(vs ...float32) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, vs)
	if err != nil {
		panic(err)
	}
	return b
}

// TestLaunch: buffers in one run are used in place; buffers in several are
// gathered, and scattered back when the kernel writes them.
func TestLaunch(t *testing.T) {
	d := newDevice(t, 1<<20)
	lookup := func(name string) *kernels.Kernel {
		k, err := kernels.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	buf := func(xs ...api.Extent) api.NodeArg { return api.NodeArg{Kind: api.ArgBuffer, Extents: xs} }
	i64 := func(v int64) api.NodeArg { return api.NodeArg{Kind: api.ArgI64, Bits: uint64(v)} }
	f32 := func(v float32) api.NodeArg { return api.NodeArg{Kind: api.ArgF32, Bits: api.F32Bits(v)} }

	// fill_f32 over two runs, 8 floats; the byte after each run stays.
	x := []api.Extent{{Addr: 4096, Len: 12}, {Addr: 8192, Len: 20}}
	if err := launch(d, lookup("fill_f32"), []api.NodeArg{buf(x...), i64(8), f32(2.5)}); err != nil {
		t.Fatal(err)
	}
	if got := f32s(read(t, d, x...)); len(got) != 8 || got[0] != 2.5 || got[7] != 2.5 {
		t.Fatalf("fill_f32 over two runs: %v", got)
	}
	if got := read(t, d, api.Extent{Addr: 4096 + 12, Len: 4}, api.Extent{Addr: 8192 + 20, Len: 4}); !bytes.Equal(got, make([]byte, 8)) {
		t.Fatalf("fill_f32 wrote past its runs: %x", got)
	}

	// saxpy: x in one run (in place), y over two runs (scattered back).
	xv := []api.Extent{{Addr: 0, Len: 16}}
	yv := []api.Extent{{Addr: 20000, Len: 8}, {Addr: 12000, Len: 8}}
	if err := d.Write(xv, f32Bytes(1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(yv, f32Bytes(10, 20, 30, 40)); err != nil {
		t.Fatal(err)
	}
	if err := launch(d, lookup("saxpy"), []api.NodeArg{i64(4), f32(2), buf(xv...), buf(yv...)}); err != nil {
		t.Fatal(err)
	}
	if got := f32s(read(t, d, yv...)); fmt.Sprint(got) != "[12 24 36 48]" {
		t.Fatalf("saxpy y = %v, want [12 24 36 48]", got)
	}

	// A kernel that refuses its arguments leaves memory as it was.
	err := launch(d, lookup("saxpy"), []api.NodeArg{i64(5), f32(2), buf(xv...), buf(yv...)})
	wantErr(t, "saxpy with n past the buffers", err, api.ErrInvalidArgument, "saxpy")
	if got := f32s(read(t, d, yv...)); fmt.Sprint(got) != "[12 24 36 48]" {
		t.Fatalf("refused saxpy changed y to %v", got)
	}
}

// rss returns the resident set of this process, in bytes.
func rss(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestLazyMemory: a device far larger than this machine's free RAM can be
// made, and costs RAM only where it is touched.
func TestLazyMemory(t *testing.T) {
	const size = 16 << 30
	before := rss(t)
	d := newDevice(t, size)
	for _, addr := range []uint64{0, size / 2, size - 4096} {
		x := []api.Extent{{Addr: addr, Len: 4096}}
		p := pattern(byte(addr>>20), 4096)
		if err := d.Write(x, p); err != nil {
			t.Fatal(err)
		}
		if got := read(t, d, x...); !bytes.Equal(got, p) {
			t.Fatalf("read back at %#x differs", addr)
		}
	}
	if got := read(t, d, api.Extent{Addr: size/4 + 12345, Len: 64}); !bytes.Equal(got, make([]byte, 64)) {
		t.Fatal("untouched memory is not zero")
	}
	// Loose: touching three pages must not commit anything like the device.
	if grown := rss(t) - min(before, rss(t)); grown > 1<<30 {
		t.Fatalf("RSS grew by %d bytes for three touched pages of a 16 GiB device", grown)
	}
	if err := d.Scrub(size/2, 4096); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, api.Extent{Addr: size / 2, Len: 4096}); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("scrubbed page is not zero")
	}
}

// TestGatherBounded: a buffer made of many extents, which may repeat, is
// refused once it adds up to more than the device holds, before anything is
// allocated for it.
func TestGatherBounded(t *testing.T) {
	const size = 1 << 20
	d := newDevice(t, size)
	whole := api.Extent{Addr: 0, Len: size}
	many := make([]api.Extent, 1<<20) // 1 TiB, were it gathered
	for i := range many {
		many[i] = whole
	}
	k, err := kernels.Lookup("fill_f32")
	if err != nil {
		t.Fatal(err)
	}
	err = launch(d, k, []api.NodeArg{
		{Kind: api.ArgBuffer, Extents: many},
		{Kind: api.ArgI64, Bits: 1},
		{Kind: api.ArgF32, Bits: api.F32Bits(1)},
	})
	wantErr(t, "launch over 1 TiB of repeated extents", err, api.ErrInvalidArgument, strconv.Itoa(len(many)), strconv.Itoa(size))
	err = d.Copy([]api.Extent{whole, whole}, []api.Extent{whole, whole})
	wantErr(t, "copy of twice the device", err, api.ErrInvalidArgument, "2 extents")
	// Exactly the device's size, in two runs, is fine.
	half := []api.Extent{{Addr: size / 2, Len: size / 2}, {Addr: 0, Len: size / 2}}
	if err := d.Copy([]api.Extent{whole}, half); err != nil {
		t.Fatalf("copy of the whole device in two runs: %v", err)
	}
}

// TestPrepareSliced: a prepared launch writes nothing until its slices run,
// runs in as many slices as maxWork calls for, and scatters a buffer
// gathered from several runs back only in finish.
func TestPrepareSliced(t *testing.T) {
	d := newDevice(t, 1<<20)
	k, err := kernels.Lookup("fill_f32")
	if err != nil {
		t.Fatal(err)
	}
	const n = 4096
	one := []api.Extent{{Addr: 0, Len: 4 * n}}
	split := []api.Extent{{Addr: 65536, Len: 2 * n}, {Addr: 32768, Len: 2 * n}}
	args := func(xs []api.Extent) []api.NodeArg {
		return []api.NodeArg{{Kind: api.ArgBuffer, Extents: xs}, {Kind: api.ArgI64, Bits: n}, {Kind: api.ArgF32, Bits: api.F32Bits(7)}}
	}
	for _, tc := range []struct {
		name    string
		xs      []api.Extent
		scatter bool
	}{{"one run", one, false}, {"two runs", split, true}} {
		p, finish, err := d.Prepare(k, args(tc.xs), n) // vectorCost 4: four slices
		if err != nil {
			t.Fatal(err)
		}
		if (finish != nil) != tc.scatter {
			t.Fatalf("%s: finish %v, want one only for a gathered buffer the kernel writes", tc.name, finish != nil)
		}
		if got := read(t, d, tc.xs...); !bytes.Equal(got, make([]byte, 4*n)) {
			t.Fatalf("%s: Prepare wrote", tc.name)
		}
		if p.Len() != 4 {
			t.Fatalf("%s: %d slices, want 4", tc.name, p.Len())
		}
		for more := true; more; {
			if more, err = p.Step(); err != nil {
				t.Fatal(err)
			}
		}
		if tc.scatter {
			if got := read(t, d, tc.xs...); !bytes.Equal(got, make([]byte, 4*n)) {
				t.Fatalf("%s: a gathered buffer changed before finish", tc.name)
			}
			if err := finish(); err != nil {
				t.Fatal(err)
			}
		}
		if got := f32s(read(t, d, tc.xs...)); got[0] != 7 || got[n-1] != 7 {
			t.Fatalf("%s: filled %v … %v", tc.name, got[0], got[n-1])
		}
	}
}

// TestWriteFrom: bytes from a reader land in the extents, in order; a bad
// extent is refused before anything is read; a short reader's error comes
// back.
func TestWriteFrom(t *testing.T) {
	d := newDevice(t, 1<<20)
	xs := []api.Extent{{Addr: 5000, Len: 10}, {Addr: 100, Len: 0}, {Addr: 70000, Len: 300}}
	p := pattern(3, 310)
	if err := d.WriteFrom(xs, bytes.NewReader(p)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, d, xs...); !bytes.Equal(got, p) {
		t.Fatalf("read back %x, want %x", got, p)
	}
	r := bytes.NewReader(pattern(4, 310))
	err := d.WriteFrom([]api.Extent{xs[0], {Addr: 1 << 20, Len: 1}}, r)
	wantErr(t, "write from a reader past the end", err, api.ErrInvalidAddress, "0x100000")
	if r.Len() != 310 {
		t.Fatalf("a refused WriteFrom read %d bytes", 310-r.Len())
	}
	err = d.WriteFrom(xs, bytes.NewReader(p[:100]))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "0x11170") {
		t.Fatalf("short reader: %v, want unexpected EOF naming the extent", err)
	}
}

// TestLaunchOverlap: saxpy over overlapping x and y gives the same result
// whether each lies in one run of memory (used in place) or several
// (gathered), as its Doc says; a kernel that splits its work over
// goroutines refuses an output that overlaps an input in device memory,
// in whatever runs they lie.
func TestLaunchOverlap(t *testing.T) {
	d := newDevice(t, 1<<20)
	saxpy, err := kernels.Lookup("saxpy")
	if err != nil {
		t.Fatal(err)
	}
	i64 := func(v int64) api.NodeArg { return api.NodeArg{Kind: api.ArgI64, Bits: uint64(v)} }
	f32 := func(v float32) api.NodeArg { return api.NodeArg{Kind: api.ArgF32, Bits: api.F32Bits(v)} }
	buf := func(xs ...api.Extent) api.NodeArg { return api.NodeArg{Kind: api.ArgBuffer, Extents: xs} }
	// Floats 0..4 at base; x is floats 0..3, y floats 1..4: x[i] is y[i-1].
	// Split runs put floats 0..1 at base and 2..4 at base+8192.
	type layout struct {
		name string
		x, y []api.Extent
		all  []api.Extent // floats 0..4
	}
	const base = 4096
	one := []api.Extent{{Addr: base, Len: 20}}
	split := []api.Extent{{Addr: base, Len: 8}, {Addr: base + 8192, Len: 12}}
	for _, l := range []layout{
		{"one run", []api.Extent{{Addr: base, Len: 16}}, []api.Extent{{Addr: base + 4, Len: 16}}, one},
		{"x in two runs", []api.Extent{{Addr: base, Len: 8}, {Addr: base + 8192, Len: 8}}, []api.Extent{{Addr: base + 4, Len: 4}, {Addr: base + 8192, Len: 12}}, split},
	} {
		if err := d.Write(l.all, f32Bytes(1, 2, 3, 4, 5)); err != nil {
			t.Fatal(err)
		}
		if err := launch(d, saxpy, []api.NodeArg{i64(4), f32(10), buf(l.x...), buf(l.y...)}); err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		// y[i] = 10*x[i] + y[i] with x as it was: 10*1+2, 10*2+3, ...
		if got := f32s(read(t, d, l.all...)); fmt.Sprint(got) != "[1 12 23 34 45]" {
			t.Errorf("%s: saxpy over overlapping x and y gave %v, want [1 12 23 34 45]", l.name, got)
		}
	}

	sgemm, err := kernels.Lookup("sgemm")
	if err != nil {
		t.Fatal(err)
	}
	// 2×2 matrices: a over two runs, c over two runs that share a's second.
	a := []api.Extent{{Addr: 65536, Len: 8}, {Addr: 65536 + 8192, Len: 8}}
	b := []api.Extent{{Addr: 65536 + 4096, Len: 16}}
	c := []api.Extent{{Addr: 65536 + 8192, Len: 8}, {Addr: 65536 + 12288, Len: 8}}
	before := read(t, d, c...)
	err = launch(d, sgemm, []api.NodeArg{i64(2), i64(2), i64(2), f32(1), buf(a...), buf(b...), f32(1), buf(c...)})
	wantErr(t, "sgemm with c over a's memory", err, api.ErrInvalidArgument, "output c overlaps input a")
	if got := read(t, d, c...); !bytes.Equal(got, before) {
		t.Fatalf("refused sgemm changed c")
	}
}
