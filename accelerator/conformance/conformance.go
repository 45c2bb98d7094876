// Package conformance is the one test suite every device backend of the
// node passes (sim in CI, cuda on a GPU host): it drives an
// accelerator.Device through its interface only and checks what the node
// relies on.
//
// What it checks, each as a subtest of Run:
//   - Info: the index asked for and a memory size in whole frames.
//   - Memory: Write, WriteFrom and Read round trips over extents that cross
//     frame boundaries, scattered and gathered; Fill; Copy with memmove
//     semantics across frames and between extent lists; Scrub of whole
//     frames, leaving their neighbours alone.
//   - Kernels: every kernel of the catalog (accelerator/kernels) launched
//     through Prepare, its plan stepped in small slices and whole, finish
//     called, against the catalog's pure-Go implementation run on host
//     copies of the same bytes; buffers that cross frames and buffers
//     passed as several extents. A kernel added to the catalog without a
//     case here fails the suite.
//   - Errors: extents outside memory (api.ErrInvalidAddress), mismatched
//     lengths, unaligned scrubs, bad kernel arguments
//     (api.ErrInvalidArgument), each naming the bad value where the backend
//     can; a refused copy, scrub or launch leaves memory as it was; a
//     failing reader or sender.
//   - Close: twice, harmlessly.
//
// Invariants of the suite itself: it needs no more than Frames frames of
// device memory, touches nothing outside the device it is given, and
// compares results bit for bit unless Options allow a relative error (a GPU
// sums in another order than the CPU reference).
package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// Frames is the number of frames of memory the suite asks of newDevice.
const Frames = 4

// frame is accelerator.FrameSize, as the uint64 extents use.
const frame = uint64(accelerator.FrameSize)

// NewDevice returns a fresh device of index 0 with at least size bytes of
// memory, whose first size bytes read as zeros. The suite closes it.
type NewDevice func(t *testing.T, size uint64) accelerator.Device

// Options tune the suite to a backend.
type Options struct {
	// MaxRelErr is the relative error allowed in a float32 kernel result
	// (against max(1, |reference|)); 0 means bit for bit, as sim computes
	// the references themselves. Index results (argmax) are always exact.
	MaxRelErr float64
}

// Run runs the suite against devices from newDevice.
func Run(t *testing.T, newDevice NewDevice, o Options) {
	open := func(t *testing.T) accelerator.Device {
		t.Helper()
		d := newDevice(t, Frames*frame)
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return d
	}
	t.Run("Info", func(t *testing.T) { testInfo(t, open(t)) })
	t.Run("WriteRead", func(t *testing.T) { testWriteRead(t, open(t)) })
	t.Run("WriteFrom", func(t *testing.T) { testWriteFrom(t, open(t)) })
	t.Run("Fill", func(t *testing.T) { testFill(t, open(t)) })
	t.Run("Copy", func(t *testing.T) { testCopy(t, open(t)) })
	t.Run("Scrub", func(t *testing.T) { testScrub(t, open(t)) })
	t.Run("Bounds", func(t *testing.T) { testBounds(t, open(t)) })
	t.Run("Kernels", func(t *testing.T) { testKernels(t, open(t), o) })
	t.Run("KernelErrors", func(t *testing.T) { testKernelErrors(t, open(t)) })
	t.Run("Close", func(t *testing.T) {
		d := newDevice(t, Frames*frame)
		if err := d.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// pattern returns n bytes that differ from one seed to another and show a
// shifted or dropped byte.
func pattern(seed byte, n uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13+i>>8) | 1 // never zero, so a scrub shows
	}
	return b
}

// read returns the bytes of xs, copied out of the device.
func read(t *testing.T, d accelerator.Device, xs ...api.Extent) []byte {
	t.Helper()
	var out []byte
	if err := d.Read(xs, func(parts ...[]byte) error {
		if len(parts) != len(xs) {
			return fmt.Errorf("send got %d parts for %d extents", len(parts), len(xs))
		}
		for i, p := range parts {
			if uint64(len(p)) != xs[i].Len {
				return fmt.Errorf("part %d holds %d bytes, extent %v %d", i, len(p), xs[i], xs[i].Len)
			}
			out = append(out, p...)
		}
		return nil
	}); err != nil {
		t.Fatalf("Read(%v): %v", xs, err)
	}
	return out
}

func write(t *testing.T, d accelerator.Device, p []byte, xs ...api.Extent) {
	t.Helper()
	if err := d.Write(xs, p); err != nil {
		t.Fatalf("Write(%v, %d bytes): %v", xs, len(p), err)
	}
}

// same fails with the first differing offset, not two megabytes of bytes.
func same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	i := 0
	for got[i] == want[i] {
		i++
	}
	t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
}

// WantErr fails t unless err wraps sentinel and its message names each
// of names: the error contract of every backend (and of the packages
// beneath them), for their own tests too.
func WantErr(t *testing.T, what string, err, sentinel error, names ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: error %v, want one wrapping %v", what, err, sentinel)
		return
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%s: error %q does not name %q", what, err, n)
		}
	}
}

func testInfo(t *testing.T, d accelerator.Device) {
	info := d.Info()
	if info.Index != 0 || info.Name == "" {
		t.Errorf("Info() = %+v, want index 0 and a name", info)
	}
	if info.Memory < Frames*frame || info.Memory%frame != 0 {
		t.Errorf("Info().Memory = %d, want whole %d-byte frames, at least %d of them", info.Memory, frame, Frames)
	}
}

func testWriteRead(t *testing.T, d accelerator.Device) {
	// One extent across the boundary of frames 0 and 1, one across 2 and
	// 3, one inside frame 1, written and read as one scattered list.
	xs := []api.Extent{{Addr: frame - 1000, Len: 3000}, {Addr: 3*frame - 7, Len: 1 << 16}, {Addr: frame + 4096, Len: 1}}
	p := pattern(1, api.ExtentsLen(xs))
	write(t, d, p, xs...)
	same(t, "read back as written", read(t, d, xs...), p)
	// Read in other pieces than written: the memory, not the request, holds
	// the bytes.
	same(t, "first extent read in two", read(t, d, api.Extent{Addr: frame - 1000, Len: 1000}, api.Extent{Addr: frame, Len: 2000}), p[:3000])
	// The bytes around the extents are untouched.
	if got := read(t, d, api.Extent{Addr: frame - 1001, Len: 1}, api.Extent{Addr: frame + 2000, Len: 1}); !bytes.Equal(got, []byte{0, 0}) {
		t.Errorf("bytes next to the written extent are %v, want zeros", got)
	}
	// A whole frame and the last byte of memory.
	last := d.Info().Memory - 1
	whole := pattern(9, frame)
	write(t, d, whole, api.Extent{Addr: 2 * frame, Len: frame})
	write(t, d, []byte{0xAB}, api.Extent{Addr: last, Len: 1})
	same(t, "whole frame", read(t, d, api.Extent{Addr: 2 * frame, Len: frame}), whole)
	same(t, "last byte", read(t, d, api.Extent{Addr: last, Len: 1}), []byte{0xAB})
	// Empty extents and an empty write are no-ops.
	write(t, d, nil)
	write(t, d, nil, api.Extent{Addr: 5, Len: 0})
	// A sender's error comes back as it was.
	boom := errors.New("send failed")
	if err := d.Read([]api.Extent{{Addr: 0, Len: 8}}, func(...[]byte) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Read with a failing send: %v, want %v", err, boom)
	}
}

func testWriteFrom(t *testing.T, d accelerator.Device) {
	xs := []api.Extent{{Addr: 2*frame - 5000, Len: 9000}, {Addr: 100, Len: 77}}
	p := pattern(3, api.ExtentsLen(xs))
	// A reader that hands out one byte at a time, as a slow socket might.
	if err := d.WriteFrom(xs, iotest.OneByteReader(bytes.NewReader(p))); err != nil {
		t.Fatalf("WriteFrom: %v", err)
	}
	same(t, "after WriteFrom", read(t, d, xs...), p)
	// Exactly the extents' length is read: what follows stays in the reader.
	r := bytes.NewReader(append(pattern(5, 77), 1, 2, 3))
	if err := d.WriteFrom([]api.Extent{{Addr: 100, Len: 77}}, r); err != nil {
		t.Fatalf("WriteFrom: %v", err)
	}
	if r.Len() != 3 {
		t.Errorf("WriteFrom left %d bytes in the reader, want 3", r.Len())
	}
	// A reader that ends early: the error wraps io.ErrUnexpectedEOF or
	// io.EOF.
	err := d.WriteFrom([]api.Extent{{Addr: 0, Len: 64}}, bytes.NewReader(make([]byte, 10)))
	if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Errorf("WriteFrom from a short reader: %v, want an EOF", err)
	}
	// A reader's own error comes back wrapped.
	boom := errors.New("socket reset")
	if err := d.WriteFrom([]api.Extent{{Addr: 0, Len: 64}}, iotest.ErrReader(boom)); !errors.Is(err, boom) {
		t.Errorf("WriteFrom from a failing reader: %v, want %v", err, boom)
	}
	// An extent outside memory is refused before a byte is read.
	r = bytes.NewReader(make([]byte, 16))
	err = d.WriteFrom([]api.Extent{{Addr: 0, Len: 8}, {Addr: d.Info().Memory, Len: 8}}, r)
	WantErr(t, "WriteFrom outside memory", err, api.ErrInvalidAddress)
	if r.Len() != 16 {
		t.Errorf("a refused WriteFrom read %d bytes first", 16-r.Len())
	}
}

func testFill(t *testing.T, d accelerator.Device) {
	xs := []api.Extent{{Addr: frame - 3, Len: 10}, {Addr: 3 * frame, Len: frame}}
	if err := d.Fill(xs, 0x5A); err != nil {
		t.Fatalf("Fill: %v", err)
	}
	same(t, "filled", read(t, d, xs...), bytes.Repeat([]byte{0x5A}, int(api.ExtentsLen(xs))))
	if got := read(t, d, api.Extent{Addr: frame - 4, Len: 1}, api.Extent{Addr: frame + 7, Len: 1}); !bytes.Equal(got, []byte{0, 0}) {
		t.Errorf("bytes next to a fill are %v, want zeros", got)
	}
	if err := d.Fill(xs[:1], 0); err != nil {
		t.Fatalf("Fill with 0: %v", err)
	}
	same(t, "filled with zeros", read(t, d, xs[0]), make([]byte, 10))
}

func testCopy(t *testing.T, d accelerator.Device) {
	// Across frames, single extents.
	src := api.Extent{Addr: frame - 100, Len: 5000}
	p := pattern(7, src.Len)
	write(t, d, p, src)
	dst := api.Extent{Addr: 3*frame - 2000, Len: 5000}
	if err := d.Copy([]api.Extent{dst}, []api.Extent{src}); err != nil {
		t.Fatalf("Copy: %v", err)
	}
	same(t, "copy", read(t, d, dst), p)
	same(t, "copy's source", read(t, d, src), p)
	// Between lists of different shapes.
	dsts := []api.Extent{{Addr: 2 * frame, Len: 1}, {Addr: 2*frame + 4096, Len: 4999}}
	if err := d.Copy(dsts, []api.Extent{src}); err != nil {
		t.Fatalf("Copy into two extents: %v", err)
	}
	same(t, "copy into two extents", read(t, d, dsts...), p)
	// Overlapping, forward and backward: memmove semantics.
	for _, shift := range []int64{+3, -3, +4096, -4096} {
		base := api.Extent{Addr: frame - 6000, Len: 10000}
		q := pattern(byte(shift), base.Len)
		write(t, d, q, base)
		to := api.Extent{Addr: uint64(int64(base.Addr) + shift), Len: base.Len}
		if err := d.Copy([]api.Extent{to}, []api.Extent{base}); err != nil {
			t.Fatalf("overlapping Copy by %+d: %v", shift, err)
		}
		same(t, fmt.Sprintf("overlapping copy by %+d", shift), read(t, d, to), q)
	}
	// Overlapping, with the source in two extents.
	base := api.Extent{Addr: 2*frame - 50, Len: 100}
	q := pattern(11, 100)
	write(t, d, q, base)
	srcs := []api.Extent{{Addr: base.Addr, Len: 60}, {Addr: base.Addr + 60, Len: 40}}
	if err := d.Copy([]api.Extent{{Addr: base.Addr + 10, Len: 100}}, srcs); err != nil {
		t.Fatalf("overlapping Copy from two extents: %v", err)
	}
	same(t, "overlapping copy from two extents", read(t, d, api.Extent{Addr: base.Addr + 10, Len: 100}), q)
	// Mismatched lengths are refused, and nothing is written.
	before := read(t, d, dst)
	err := d.Copy([]api.Extent{dst}, []api.Extent{{Addr: 0, Len: dst.Len - 1}})
	WantErr(t, "Copy of mismatched lengths", err, api.ErrInvalidArgument)
	same(t, "destination of a refused copy", read(t, d, dst), before)
}

func testScrub(t *testing.T, d accelerator.Device) {
	all := api.Extent{Addr: 0, Len: Frames * frame}
	write(t, d, pattern(13, all.Len), all)
	if err := d.Scrub(frame, 2*frame); err != nil {
		t.Fatalf("Scrub frames 1 and 2: %v", err)
	}
	same(t, "scrubbed frames", read(t, d, api.Extent{Addr: frame, Len: 2 * frame}), make([]byte, 2*frame))
	p := pattern(13, all.Len)
	same(t, "frame 0 after its neighbour's scrub", read(t, d, api.Extent{Addr: 0, Len: frame}), p[:frame])
	same(t, "frame 3 after its neighbour's scrub", read(t, d, api.Extent{Addr: 3 * frame, Len: frame}), p[3*frame:])
	// A scrubbed frame takes new data as any other.
	write(t, d, []byte{1, 2, 3}, api.Extent{Addr: frame + 5, Len: 3})
	same(t, "write after scrub", read(t, d, api.Extent{Addr: frame + 4, Len: 5}), []byte{0, 1, 2, 3, 0})
	if err := d.Scrub(0, 0); err != nil {
		t.Errorf("Scrub of nothing: %v", err)
	}
	// Bad ranges: outside memory, and not page aligned.
	size := d.Info().Memory
	WantErr(t, "Scrub past the end", d.Scrub(size-frame, 2*frame), api.ErrInvalidAddress)
	WantErr(t, "Scrub of an overflowing range", d.Scrub(frame, math.MaxUint64-frame+1), api.ErrInvalidAddress)
	err := d.Scrub(frame+1, 4096)
	WantErr(t, "Scrub at an unaligned address", err, api.ErrInvalidArgument)
	same(t, "bytes next to a refused scrub", read(t, d, api.Extent{Addr: frame + 5, Len: 3}), []byte{1, 2, 3})
}

func testBounds(t *testing.T, d accelerator.Device) {
	size := d.Info().Memory
	bad := []api.Extent{
		{Addr: size, Len: 1},
		{Addr: size - 4, Len: 5},
		{Addr: math.MaxUint64, Len: 2},
		{Addr: 8, Len: math.MaxUint64 - 4},
	}
	for _, x := range bad {
		xs := []api.Extent{{Addr: 0, Len: 4}, x}
		what := fmt.Sprintf("[%#x, +%d)", x.Addr, x.Len)
		WantErr(t, "Read "+what, d.Read(xs, func(...[]byte) error { return nil }), api.ErrInvalidAddress)
		WantErr(t, "Fill "+what, d.Fill(xs, 1), api.ErrInvalidAddress)
		WantErr(t, "Copy into "+what, d.Copy([]api.Extent{x}, []api.Extent{{Addr: 0, Len: x.Len}}), api.ErrInvalidAddress)
		WantErr(t, "Copy from "+what, d.Copy([]api.Extent{{Addr: 0, Len: x.Len}}, []api.Extent{x}), api.ErrInvalidAddress)
		if x.Len < 1<<20 {
			WantErr(t, "Write "+what, d.Write(xs, make([]byte, 4+x.Len)), api.ErrInvalidAddress)
		}
	}
	WantErr(t, "Write of mismatched length", d.Write([]api.Extent{{Addr: 0, Len: 8}}, make([]byte, 7)), api.ErrInvalidArgument, "7", "8")
}

// Launch runs k on d as the node does: Prepare, every slice of the plan,
// then finish.
func Launch(d accelerator.Device, k *kernels.Kernel, args []api.NodeArg, maxWork int) error {
	p, finish, err := d.Prepare(k, args, maxWork)
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

// rng is the suite's source of inputs: seeded, so a failure repeats.
func rng() *rand.Rand { return rand.New(rand.NewPCG(19, 1)) }
