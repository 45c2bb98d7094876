package mediator_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

func TestCopiesKernelsAndRelease(t *testing.T) {
	s := start(t, 1, 1, 1<<30, 0)
	c := s.dial(t, "a", 1)
	st := c.Stream()
	const n = 3<<20 + 12 // several chunks, not a whole number of pages
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 31)
	}
	p, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	st.CopyToDevice(p, data)
	st.CopyDevice(q, p, n)
	st.Memset(q.Add(100), 0xAB, 50)
	got := make([]byte, n)
	st.CopyFromDevice(got, q)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(data)
	for i := 100; i < 150; i++ {
		want[i] = 0xAB
	}
	if !bytes.Equal(got, want) {
		t.Fatal("device copy and memset: bytes differ")
	}

	// Fresh memory reads as zeros.
	z, err := c.Malloc(0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 8192)
	for i := range zero {
		zero[i] = 1
	}
	st.CopyFromDevice(zero, z)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(zero, make([]byte, 8192)) {
		t.Fatal("new allocation is not zero")
	}

	status := s.med.Status()
	if len(status.Tenants) != 1 || status.Tenants[0].Tenant != "a" || status.Tenants[0].CopiedIn != n {
		t.Fatalf("status tenants = %+v", status.Tenants)
	}
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.waitIdle(t)
}

func TestStreamsRunIndependentlyInOrder(t *testing.T) {
	s := start(t, 1, 1, 1<<30, 0)
	c := s.dial(t, "a", 1)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := c.NewStream()
			if err != nil {
				t.Error(err)
				return
			}
			p, err := c.Malloc(0, 4096)
			if err != nil {
				t.Error(err)
				return
			}
			got := make([]byte, 4096)
			for round := range 50 {
				v := byte(i*50 + round)
				st.Memset(p, v, 4096)
				st.CopyFromDevice(got, p)
			}
			if err := st.Synchronize(); err != nil {
				t.Error(err)
				return
			}
			if want := bytes.Repeat([]byte{byte(i*50 + 49)}, 4096); !bytes.Equal(got, want) {
				t.Errorf("stream %d: last write did not win: got %d", i, got[0])
			}
			if err := st.Destroy(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func TestTwoNodesTwoDevices(t *testing.T) {
	s := start(t, 2, 1, 256<<20, 0)
	c := s.dial(t, "a", 2)
	if len(c.Devices()) != 2 || c.Devices()[0].Node == c.Devices()[1].Node {
		t.Fatalf("devices %+v: want one on each node", c.Devices())
	}
	const n = 5 << 20
	p0, err := c.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := c.Malloc(1, n)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(1, n)
	st := c.Stream()
	st.CopyToDevice(p0, data)
	st.CopyDevice(p1, p0, n) // crosses nodes
	st.Launch("fill_f32", client.Buf(p0), client.I64(4), client.F32(0))
	got := make([]byte, n)
	st.CopyFromDevice(got, p1)
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("cross-node copy: bytes differ")
	}
	// A kernel's buffers must all be on one device.
	st.Launch("saxpy", client.I64(4), client.F32(1), client.Buf(p0), client.Buf(p1))
	wantErr(t, st.Synchronize(), api.ErrInvalidArgument, "device 1", "device 0")
}

func TestTenantMemoryCapIsExact(t *testing.T) {
	const limit = 8 << 20
	s := start(t, 1, 1, 256<<20, limit)
	c := s.dial(t, "a", 1)
	p, err := c.Malloc(0, limit)
	if err != nil {
		t.Fatalf("allocation of exactly the limit: %v", err)
	}
	_, err = c.Malloc(0, 1)
	wantErr(t, err, api.ErrQuotaExceeded)
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	_, err = c.Malloc(0, limit+1)
	wantErr(t, err, api.ErrQuotaExceeded)
}

func TestManyTenantsConcurrently(t *testing.T) {
	s := start(t, 1, 2, 512<<20, 0)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(client.Options{Socket: s.socket, Tenant: fmt.Sprintf("t%d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			for range 20 {
				n := 1 + rng.IntN(3<<20)
				p, err := c.Malloc(0, uint64(n))
				if err != nil {
					t.Error(err)
					return
				}
				data := randomBytes(rng.Uint64(), n)
				got := make([]byte, n)
				st := c.Stream()
				st.CopyToDevice(p, data)
				st.CopyFromDevice(got, p)
				if err := st.Synchronize(); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, data) {
					t.Errorf("tenant %d: read back differs", i)
					return
				}
				if rng.IntN(2) == 0 {
					if err := c.Free(p); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	s.waitIdle(t)
}
