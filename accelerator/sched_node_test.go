package accelerator

import (
	"errors"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// connectShare is testNode.connect with the tenant's weight and compute cap
// in the Hello, as a mediator sends them.
func (tn *testNode) connectShare(t *testing.T, tenant string, weight uint32, computeMax float32) *client {
	t.Helper()
	conn := tn.dialRaw(t)
	rpc := api.NewRPC(conn, "node "+tn.addr)
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
// capped by compute_max stays within its cap however its launches fail.
// Each launch here gathers a 16 MiB table in 8 runs, then fails on an index
// out of range, which only the gathered bytes can show.
func TestLaunchPreparationIsCharged(t *testing.T) {
	tn := startNode(t)
	for _, tc := range []struct {
		tenant string
		cap    float32
	}{{"gatherer", 0}, {"capped", 0.1}} {
		c := tn.connectShare(t, tc.tenant, 1, tc.cap)
		const runs, dim = 8, 64
		frames := c.alloc(0, runs+1)
		var table []api.Extent
		for _, f := range frames[:runs] {
			table = append(table, ext(f, 0, FrameSize))
		}
		rows := int64(runs * FrameSize / 4 / dim)
		small := frames[runs]
		c.mustWrite(0, []api.Extent{ext(small, 0, 8)}, []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}) // index 0, then 2^31-1
		bad := func() error {
			return c.launch(0, "embedding_bag_sum", bufArg(table...), i64Arg(rows), i64Arg(dim),
				bufArg(ext(small, 0, 8)), i64Arg(2), bufArg(ext(small, 8, 4)), i64Arg(1), bufArg(ext(small, 4096, 4*dim)))
		}
		launches := 0
		start := time.Now()
		for time.Since(start) < 500*time.Millisecond {
			if err := bad(); !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("%s: launch with an index out of range: %v", tc.tenant, err)
			}
			launches++
		}
		wall := time.Since(start)
		var charged time.Duration
		for _, s := range c.status().Shares {
			if s.Tenant == tc.tenant {
				charged = s.DeviceTime
			}
		}
		t.Logf("%s: %d failed launches in %v, %v charged", tc.tenant, launches, wall, charged)
		if tc.cap == 0 && charged < wall/2 {
			t.Errorf("%s: failed launches gathering %d runs each took %v, %v of it charged: want at least half", tc.tenant, runs, wall, charged)
		}
		// The cap's share of the time, its first bucket, and one gathering
		// past the bucket's end.
		if limit := time.Duration(float64(tc.cap)*float64(wall+capWindow)) + wall/10; tc.cap > 0 && charged > limit {
			t.Errorf("%s: capped at %.2f, charged %v in %v: want at most %v", tc.tenant, tc.cap, charged, wall, limit)
		}
	}
}
