package mediator_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// Hostile tenants. Each attack runs next to a victim tenant doing checked
// copies; the victim's results must stay right and its service must go on
// at normal speed, and once the attacker is gone the mediator holds none of
// its sessions or memory.

// victimBound is how long one round of victim work may take under attack.
// Unattacked it takes milliseconds; a victim stuck behind an attacker would
// take ReplyTimeout or forever.
const victimBound = 3 * time.Second

// shortReplyTimeout makes slow readers time out after d for this test. Call
// it before starting the system: the restore then runs after its Close.
func shortReplyTimeout(t *testing.T, d time.Duration) {
	old := mediator.ReplyTimeout
	mediator.ReplyTimeout = d
	t.Cleanup(func() { mediator.ReplyTimeout = old })
}

// underAttack runs victim rounds on c until stop is closed, failing the test
// if a round is wrong or slower than victimBound. It returns the number of
// rounds, once stop is closed and the last round is done.
func underAttack(t *testing.T, c *client.Client, stop <-chan struct{}) <-chan int {
	t.Helper()
	out := make(chan int, 1)
	go func() {
		rounds := 0
		defer func() { out <- rounds }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			if err := victimRound(c, uint64(rounds)); err != nil {
				t.Errorf("victim round %d: %v", rounds, err)
				return
			}
			if d := time.Since(start); d > victimBound {
				t.Errorf("victim round %d took %v under attack", rounds, d)
				return
			}
			rounds++
		}
	}()
	return out
}

// victimRound is victim, returning its failure instead of failing the test
// (it runs on a goroutine of its own): allocate, copy in, compute, copy out,
// check, free.
func victimRound(c *client.Client, seed uint64) error {
	const n = 64 << 10
	x, err := c.Malloc(0, n*4)
	if err != nil {
		return err
	}
	defer c.Free(x)
	y, err := c.Malloc(0, n*4)
	if err != nil {
		return err
	}
	defer c.Free(y)
	xs, ys := make([]float32, n), make([]float32, n)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range xs {
		xs[i], ys[i] = float32(rng.IntN(100)), float32(rng.IntN(100))
	}
	st := c.Stream()
	st.CopyToDevice(x, client.Float32Bytes(xs))
	st.CopyToDevice(y, client.Float32Bytes(ys))
	st.Launch("saxpy", client.I64(n), client.F32(2), client.Buf(x), client.Buf(y))
	got := make([]byte, n*4)
	st.CopyFromDevice(got, y)
	if err := st.Synchronize(); err != nil {
		return err
	}
	for i, v := range client.BytesFloat32(got) {
		if want := 2*xs[i] + ys[i]; v != want {
			return fmt.Errorf("saxpy: y[%d] = %v, want %v", i, v, want)
		}
	}
	return nil
}

// attack runs fn next to a victim, then checks the victim did some rounds.
func attack(t *testing.T, s *system, fn func()) {
	t.Helper()
	good := s.dial(t, "victim", 1)
	victim(t, good)
	stop := make(chan struct{})
	rounds := underAttack(t, good, stop)
	n := -1
	func() {
		// also when fn fails the test: the victim must stop before cleanup
		defer func() { close(stop); n = <-rounds }()
		fn()
	}()
	if n == 0 && !t.Failed() {
		t.Fatal("victim completed no round during the attack")
	}
	victim(t, good)
}

// hostile is a raw tenant connection that has said hello.
func hostile(t *testing.T, s *system, tenant string) *wire.Conn {
	t.Helper()
	c := raw(t, s)
	if _, err := roundTrip(t, c, api.OpHello, hello(tenant, api.Version)); err != nil {
		t.Fatal(err)
	}
	return c
}

func mallocRaw(t *testing.T, c *wire.Conn, size uint64) uint64 {
	t.Helper()
	return mallocHint(t, c, size, api.HintNone)
}

func TestHostileFloodOfSmallRequests(t *testing.T) {
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		bad := s.dial(t, "flood", 1)
		buf, err := bad.Malloc(0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		var streams []*client.Stream
		for range 8 {
			st, err := bad.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
		var wg sync.WaitGroup
		var sent atomic.Int64
		deadline := time.Now().Add(2 * time.Second)
		for i, st := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					for range 1000 {
						st.Memset(buf.Add(uint64(i)), byte(i), 1)
					}
					sent.Add(1000)
					if err := st.Synchronize(); err != nil {
						t.Errorf("flood: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if sent.Load() < 1000 {
			t.Fatalf("flooder sent only %d requests", sent.Load())
		}
		got := make([]byte, 8)
		bad.Stream().CopyFromDevice(got, buf)
		if err := bad.Stream().Synchronize(); err != nil || !bytes.Equal(got, []byte{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Fatalf("flooder's own results: %v %v", got, err)
		}
		bad.Close()
	})
	s.waitIdleExcept(t, 1)
}

// A tenant that sends requests without ever reading the replies fills its own
// socket; the mediator stops reading it, and after ReplyTimeout drops it.
func TestHostileFloodWithoutReading(t *testing.T) {
	shortReplyTimeout(t, time.Second)
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		c := hostile(t, s, "flood")
		buf := mallocRaw(t, c, 1<<20)
		req := api.Encode(&api.Memset{Dst: buf, Value: 1, Len: 1})
		done := make(chan int)
		go func() {
			n := 0
			for ; ; n++ {
				if err := c.WriteFrame(api.OpMemset, 0, uint64(n), req); err != nil {
					break
				}
			}
			done <- n
		}()
		select {
		case n := <-done:
			t.Logf("flooder dropped after %d unread requests", n)
		case <-time.After(20 * time.Second):
			t.Fatal("flooder still connected after 20s")
		}
	})
	s.waitIdleExcept(t, 1)
}

func TestHostileAbsurdAllocations(t *testing.T) {
	s := startWith(t, 256<<20, func(c *mediator.Config) { c.TenantMemory = 16 << 20 })
	attack(t, s, func() {
		bad := s.dial(t, "greedy", 1)
		for _, size := range []uint64{0, 1 << 62, ^uint64(0), 1<<64 - 4096, 17 << 20, 300 << 20} {
			if _, err := bad.Malloc(0, size); err == nil {
				t.Fatalf("malloc of %d bytes succeeded", size)
			} else if c := api.CodeOf(err); c != api.CodeInvalidArgument && c != api.CodeQuotaExceeded && c != api.CodeOutOfMemory {
				t.Fatalf("malloc of %d bytes: %v", size, err)
			}
		}
		if _, err := bad.Malloc(1<<31, 4096); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Fatalf("malloc on device 2^31: %v", err)
		}
		// many tiny ones, until the cap
		var ptrs []client.Ptr
		for {
			p, err := bad.Malloc(0, 1)
			if err != nil {
				wantErr(t, err, api.ErrQuotaExceeded)
				break
			}
			ptrs = append(ptrs, p)
			if len(ptrs) > 1<<16 {
				t.Fatal("no cap reached after 65536 allocations")
			}
		}
		t.Logf("%d tiny allocations reached the cap", len(ptrs))
		bad.Close()
	})
	s.waitIdleExcept(t, 1)
}

func TestHostileForgedAddresses(t *testing.T) {
	s := startWith(t, 256<<20, nil)
	good := s.dial(t, "victim", 1)
	secret := randomBytes(99, 1<<20)
	vbuf, err := good.Malloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	good.Stream().CopyToDevice(vbuf, secret)
	if err := good.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	attack(t, s, func() {
		bad := s.dial(t, "forger", 1)
		own, err := bad.Malloc(0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		addrs := []client.Ptr{0, 1, vbuf, vbuf.Add(4096), vbuf.Add(1<<20 - 1), own.Add(4096), ^client.Ptr(0), ^client.Ptr(0) - 4095}
		for range 200 {
			addrs = append(addrs, client.Ptr(rng.Uint64()), vbuf.Add(rng.Uint64N(1<<20)))
		}
		st := bad.Stream()
		junk := make([]byte, 4096)
		for _, a := range addrs {
			ops := []func(){
				func() { st.CopyToDevice(a, junk) },
				func() { st.CopyFromDevice(make([]byte, 16), a) },
				func() { st.Memset(a, 0xee, 1<<20) },
				func() { st.CopyDevice(a, own, 4096) },
				func() { st.CopyDevice(own, a, 4096) },
				func() { st.Launch("saxpy", client.I64(1024), client.F32(1), client.Buf(own), client.Buf(a)) },
			}
			for _, op := range ops {
				op()
				err := st.Synchronize()
				// vbuf's address may happen to be a valid address of the
				// forger's own space, which it is welcome to use.
				if err != nil && !errors.Is(err, api.ErrInvalidAddress) && !errors.Is(err, api.ErrInvalidArgument) {
					t.Fatalf("forged address %#x: %v", uint64(a), err)
				}
			}
			if err := bad.Free(a); err == nil && a != own {
				t.Fatalf("freeing forged address %#x succeeded", uint64(a))
			}
		}
		bad.Close()
	})
	got := make([]byte, len(secret))
	good.Stream().CopyFromDevice(got, vbuf)
	if err := good.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatal("the victim's buffer changed under forged addresses")
	}
	s.waitIdleExcept(t, 2) // good and attack's victim
}

func TestHostileReadsOfFreedMemory(t *testing.T) {
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		bad := s.dial(t, "snoop", 1)
		other := s.dial(t, "other", 1)
		for _, size := range []uint64{64, 4096, 64 << 10, 2 << 20} {
			secret := bytes.Repeat([]byte{0xa5}, int(size))
			p, err := other.Malloc(0, size)
			if err != nil {
				t.Fatal(err)
			}
			other.Stream().CopyToDevice(p, secret)
			if err := other.Stream().Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := other.Free(p); err != nil {
				t.Fatal(err)
			}
			// the owner's stale pointer is dead
			other.Stream().CopyFromDevice(make([]byte, size), p)
			wantErr(t, other.Stream().Synchronize(), api.ErrInvalidAddress)
			// nobody's new memory shows the old contents
			for _, c := range []*client.Client{bad, other} {
				q, err := c.Malloc(0, size)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, size)
				c.Stream().CopyFromDevice(got, q)
				if err := c.Stream().Synchronize(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, make([]byte, size)) {
					t.Fatalf("new allocation of %d bytes shows freed contents", size)
				}
				if err := c.Free(q); err != nil {
					t.Fatal(err)
				}
			}
		}
		bad.Close()
		other.Close()
	})
	s.waitIdleExcept(t, 1)
}

func TestHostileHalfOpenConnections(t *testing.T) {
	old := wire.BodyTimeout
	wire.BodyTimeout = time.Second
	t.Cleanup(func() { wire.BodyTimeout = old })
	shortReplyTimeout(t, time.Second)
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		// connects and says nothing (dropped after HandshakeTimeout, 10s;
		// here it only must not disturb anyone)
		silent := raw(t, s)
		// a frame header, then nothing
		mid := hostile(t, s, "mid")
		mallocRaw(t, mid, 1<<20)
		hdr := make([]byte, wire.HeaderSize)
		binary.LittleEndian.PutUint32(hdr, 100)
		binary.LittleEndian.PutUint16(hdr[4:], uint16(api.OpMalloc))
		if _, err := mid.NetConn().Write(hdr); err != nil {
			t.Fatal(err)
		}
		// asks for a lot, closes its sending side and reads nothing
		half := hostile(t, s, "half")
		src := mallocRaw(t, half, 1<<20)
		req := api.Encode(&api.CopyFromDevice{Src: src, Len: 1 << 20})
		for i := range 300 {
			if err := half.WriteFrame(api.OpCopyFromDevice, 0, uint64(i), req); err != nil {
				t.Fatal(err)
			}
		}
		if err := half.NetConn().(*net.UnixConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		// hello, then idle: a session like any other, holding nothing
		idle := hostile(t, s, "idle")
		if !closed(mid) {
			t.Fatal("connection stalled mid-frame not dropped")
		}
		s.waitIdleExcept(t, 2) // the victim and the idle session
		silent.Close()
		idle.Close()
	})
	s.waitIdleExcept(t, 1)
}

func TestHostileOversizedFrames(t *testing.T) {
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		for _, size := range []uint32{wire.MaxBody + 1, 1 << 31, ^uint32(0)} {
			for _, afterHello := range []bool{false, true} {
				var c *wire.Conn
				if afterHello {
					c = hostile(t, s, "big")
					mallocRaw(t, c, 4<<20)
				} else {
					c = raw(t, s)
				}
				hdr := make([]byte, wire.HeaderSize)
				binary.LittleEndian.PutUint32(hdr, size)
				binary.LittleEndian.PutUint16(hdr[4:], uint16(api.OpCopyToDevice))
				if _, err := c.NetConn().Write(hdr); err != nil {
					t.Fatal(err)
				}
				if !closed(c) {
					t.Fatalf("connection open after a %d-byte frame header", size)
				}
			}
		}
		// the largest body allowed, as one copy: served or refused, typed
		c := hostile(t, s, "big")
		dst := mallocRaw(t, c, 4<<20)
		var e wire.Encoder
		e.U32(0)
		e.U64(dst)
		payload := make([]byte, wire.MaxBody-len(e.B))
		_, err := roundTrip(t, c, api.OpCopyToDevice, e.B, payload)
		if err != nil && api.CodeOf(err) == api.CodeInternal {
			t.Fatalf("largest frame: %v", err)
		}
		if _, err := roundTrip(t, c, api.OpMalloc, api.Encode(&api.Malloc{Size: 4096})); err != nil {
			t.Fatalf("session after the largest frame: %v", err)
		}
		c.Close()
	})
	s.waitIdleExcept(t, 1)
}

// A tenant that asks for many copies from the device and never reads them
// holds up only its own streams, and is dropped after ReplyTimeout.
func TestHostileSlowReader(t *testing.T) {
	shortReplyTimeout(t, time.Second)
	s := startWith(t, 256<<20, nil)
	attack(t, s, func() {
		c := hostile(t, s, "slow")
		src := mallocRaw(t, c, 1<<20)
		streams := []uint32{0}
		for range 3 {
			b, err := roundTrip(t, c, api.OpStreamCreate)
			if err != nil {
				t.Fatal(err)
			}
			var r api.StreamReq
			if err := api.Decode(b, &r); err != nil {
				t.Fatal(err)
			}
			streams = append(streams, r.Stream)
		}
		done := make(chan int)
		go func() {
			n := 0
			for ; n < 1<<20; n++ {
				req := api.Encode(&api.CopyFromDevice{Stream: streams[n%len(streams)], Src: src, Len: 1 << 20})
				if err := c.WriteFrame(api.OpCopyFromDevice, 0, uint64(n), req); err != nil {
					break
				}
			}
			done <- n
		}()
		select {
		case n := <-done:
			t.Logf("slow reader dropped after %d requests", n)
		case <-time.After(20 * time.Second):
			t.Fatal("slow reader still connected after 20s")
		}
		if os.Getenv("HOSTILE_DEBUG") != "" {
			time.Sleep(time.Minute)
		}
	})
	s.waitIdleExcept(t, 1)
}
