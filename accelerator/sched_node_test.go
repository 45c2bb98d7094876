package accelerator

import (
	"errors"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// connectShare is testNode.connect with the tenant's weight and compute cap
// in the Hello, as a mediator sends them.
func (tn *testNode) connectShare(t *testing.T, tenant string, weight uint32, computeMax float32) *client {
	t.Helper()
	conn := tn.dialRaw(t)
	rpc := wire.NewRPC(conn, "node "+tn.addr)
	t.Cleanup(func() { rpc.Close() })
	c := &client{t: t, conn: conn, rpc: rpc}
	h := mediatorHello(tenant)
	h.Weight, h.ComputeMax = weight, computeMax
	body, err := rpc.Call(api.OpHello, nil, api.Encode(h))
	if err != nil {
		t.Fatalf("hello as %q: %v", tenant, err)
	}
	if err := api.Decode(body, &c.hello); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLaunchThroughScheduler: launches of several slices run through the
// device's scheduler, which accounts them to the tenant named in the Hello,
// with its weight and cap; connections of one tenant share an account.
func TestLaunchThroughScheduler(t *testing.T) {
	tn := startNode(t)
	a1 := tn.connectShare(t, "alice", 3, 0)
	a2 := tn.connectShare(t, "alice", 3, 0)
	b := tn.connectShare(t, "bob", 0, 0.5)
	const n = FrameSize / 4 // one frame of floats: several slices
	for i, c := range []*client{a1, a2, b} {
		f := c.alloc(0, 1)[0]
		if err := c.launch(0, "fill_f32", bufArg(ext(f, 0, FrameSize)), i64Arg(n), f32Arg(float32(i+1))); err != nil {
			t.Fatal(err)
		}
		got := bytesF32(c.mustRead(0, ext(f, FrameSize-8, 8)))
		if got[0] != float32(i+1) || got[1] != float32(i+1) {
			t.Fatalf("fill through the scheduler: %v", got)
		}
	}
	st := a1.status()
	want := map[string]api.DeviceTenant{
		"alice": {Device: 0, Tenant: "alice", Weight: 3, Launches: 2},
		"bob":   {Device: 0, Tenant: "bob", Weight: 1, ComputeMax: 0.5, Launches: 1},
	}
	if len(st.Shares) != len(want) {
		t.Fatalf("shares %+v, want alice and bob on device 0", st.Shares)
	}
	for _, s := range st.Shares {
		w := want[s.Tenant]
		if s.Device != w.Device || s.Weight != w.Weight || s.Launches != w.Launches || s.DeviceTime <= 0 ||
			s.Slices < 2*s.Launches || s.ComputeMax < w.ComputeMax-1e-6 || s.ComputeMax > w.ComputeMax+1e-6 {
			t.Errorf("share %+v, want %+v with device time and several slices a launch", s, w)
		}
	}
	// A rejected launch never reaches the scheduler.
	if err := b.launch(0, "fill_f32", bufArg(ext(0, 0, 4)), i64Arg(1), f32Arg(1)); err == nil {
		t.Fatal("launch on a frame not held: no error")
	}
	if got := a1.status().Shares[1].Launches; got != 1 {
		t.Fatalf("bob's launches after a rejected one: %d, want 1", got)
	}
}

// TestLaunchPreparationIsCharged: gathering a buffer that lies in several
// runs of memory is device work, charged to the launching tenant, and a
// launch that fails after its gathering still waits its turn, so a tenant
// capped by compute_max stays within its cap however its launches fail:
// it completes no more of them a second than its cap allows, nor far
// fewer, alone or beside an uncapped tenant, which it does not starve.
// Each launch here gathers a 4 MiB table in 8 runs, then fails on an
// index out of range, which only the gathered bytes can show.
func TestLaunchPreparationIsCharged(t *testing.T) {
	tn := startNode(t)
	capped := tn.connectShare(t, "capped", 1, 0.1)
	cappedWork := failingGathers(t, capped)
	gatherer := tn.connectShare(t, "gatherer", 1, 0)
	gather := failingGathers(t, gatherer)
	onLoadedHost(t, func(r timing) {
		before := gatherer.share(0, "gatherer").DeviceTime
		launches, wall := gather(300 * time.Millisecond)
		charged := gatherer.share(0, "gatherer").DeviceTime - before
		r.Logf("gatherer: %d failed launches in %v, %v charged", launches, wall, charged)
		if charged < wall/2 {
			r.Errorf("gatherer: failed launches gathering runs took %v, %v of it charged: want at least half", wall, charged)
		}
		checkCapped(r, capCheck{cap: 0.1, unit: "launches", per: 1, freeRate: rate(launches, wall),
			capped: cappedWork, free: gather, beside: gather,
			share: func() api.DeviceTenant { return capped.share(0, "capped") }})
	})
}

// failingGathers returns work for checkCapped: c's launches on device 0
// that each gather a 4 MiB table in 8 runs, then fail on an index out of
// range, which only the gathered bytes can show, counted. It makes one
// first, to warm up.
func failingGathers(t *testing.T, c *client) func(d time.Duration) (uint64, time.Duration) {
	const runs, dim = 8, 64
	frames := c.alloc(0, runs+1)
	var table []api.Extent
	for _, f := range frames[:runs] {
		table = append(table, ext(f, 0, FrameSize/4))
	}
	rows := int64(runs * FrameSize / 4 / 4 / dim)
	small := frames[runs]
	c.mustWrite(0, []api.Extent{ext(small, 0, 8)}, []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}) // index 0, then 2^31-1
	work := func(d time.Duration) (uint64, time.Duration) {
		var launches uint64
		start := time.Now()
		for time.Since(start) < d {
			err := c.launch(0, "embedding_bag_sum", bufArg(table...), i64Arg(rows), i64Arg(dim),
				bufArg(ext(small, 0, 8)), i64Arg(2), bufArg(ext(small, 8, 4)), i64Arg(1), bufArg(ext(small, 4096, 4*dim)))
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Errorf("launch with an index out of range: %v", err)
				break
			}
			launches++
		}
		return launches, time.Since(start)
	}
	work(time.Millisecond)
	return work
}
