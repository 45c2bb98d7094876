package accelerator

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// TestSchedDecodeFirst: a decode job that arrives while another tenant's
// bulk job runs waits only for the slice in progress, then runs to its end
// (its 8 ms are within decodeLead); the same job as bulk work shares the
// device slice by slice and takes about twice as long.
func TestSchedDecodeFirst(t *testing.T) {
	for _, tc := range []struct {
		phase api.Phase
		want  time.Duration // from its arrival to its end
	}{
		{api.PhaseDecode, 8 * time.Millisecond},
		{api.PhaseOther, 15 * time.Millisecond}, // 8 ms of its own and 7 slices of the other's
	} {
		t.Run(tc.phase.String(), func(t *testing.T) {
			h := newSchedHarness(t)
			var arrived, ended time.Duration
			done := make(chan (<-chan error), 1)
			const slice, decodeSlices = 200 * time.Microsecond, 40
			bulk := h.submitPhase(tenantShare{name: "bulk"}, api.PhasePrefill, time.Millisecond, func(i int) bool {
				if i == 100 { // arrives as the bulk's 100th slice ends
					arrived = h.clock.now()
					done <- h.submitPhase(tenantShare{name: "step"}, tc.phase, slice, func(i int) bool {
						ended = h.clock.now()
						return i < decodeSlices
					})
				}
				return i < 200
			})
			if err := <-<-done; err != nil {
				t.Fatal(err)
			}
			if err := <-bulk; err != nil {
				t.Fatal(err)
			}
			if got := ended - arrived; got != tc.want {
				t.Fatalf("a job of %d slices of %v (%v) beside bulk slices of 1 ms took %v from its arrival, want %v",
					decodeSlices, slice, tc.phase, got, tc.want)
			}
		})
	}
}

// TestSchedDecodeKeepsShares: decode priority reorders work within the
// shares: a tenant that calls all its work decode, beside a bulk tenant,
// gets its weight's share and never runs more than decodeLead (as its
// device time over its weight) and a slice ahead of it.
func TestSchedDecodeKeepsShares(t *testing.T) {
	for _, w := range []uint32{1, 3} {
		t.Run(fmt.Sprint("weight ", w), func(t *testing.T) {
			h := newSchedHarness(t)
			h.hold()
			const horizon, slice = 4 * time.Second, time.Millisecond
			var lead time.Duration // the decode tenant's most, over the bulk's, both over weights
			var dec, bulk time.Duration
			var mu sync.Mutex
			track := func(d *time.Duration, scale uint32) func(int) bool {
				return func(int) bool {
					mu.Lock()
					*d += slice / time.Duration(scale)
					lead = max(lead, dec-bulk)
					mu.Unlock()
					return h.clock.now() < horizon
				}
			}
			h.submitPhase(tenantShare{name: "greedy", weight: w}, api.PhaseDecode, slice, track(&dec, w))
			h.submitPhase(tenantShare{name: "bulk"}, api.PhasePrefill, slice, track(&bulk, 1))
			h.release()
			h.wait()
			done := h.completed()
			share := done["greedy"].Seconds() / (done["greedy"] + done["bulk"]).Seconds()
			if want := float64(w) / float64(w+1); share < want-0.005 || share > want+0.005 {
				t.Errorf("decode tenant of weight %d beside a bulk one: share %.4f, want %.4f", w, share, want)
			}
			if limit := decodeLead + slice; lead > limit {
				t.Errorf("decode tenant ran %v ahead of its share, want at most %v", lead, limit)
			}
			if lead < decodeLead/2 {
				t.Errorf("decode tenant ran at most %v ahead of its share: decode priority did not apply", lead)
			}
		})
	}
}

// TestSchedChargeTakesLastPhase: an empty job that charges a tenant's work
// off the runners (runCharge) is of the phase of the tenant's last slice.
// A decode tenant ahead of a heavier bulk tenant in virtual time, within
// decodeLead, has its charge run after the slice in progress; as bulk work
// (as charges were) it would wait for the bulk tenant to catch up, and
// after a prefill of its own it does.
func TestSchedChargeTakesLastPhase(t *testing.T) {
	const slice = time.Millisecond
	for _, tc := range []struct {
		name             string
		last             api.Phase // of the tenant's job before the charge
		plain            bool      // the charge as an empty job of phase other
		minWait, maxWait int       // bulk slices run while the charge waits
	}{
		{"after decode", api.PhaseDecode, false, 0, 1},
		{"after decode, as bulk work", api.PhaseDecode, true, 15, 25},
		{"after prefill", api.PhasePrefill, false, 5, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t)
			dec := tenantShare{name: "dec"}
			slicesOf := func() uint64 {
				h.s.mu.Lock()
				defer h.s.mu.Unlock()
				return h.s.accounts[dec.name].slices
			}
			var jobDone <-chan error
			charged := make(chan error, 1)
			arrived, wait := -1, -1
			bulk := h.submitPhase(tenantShare{name: "bulk", weight: 10}, api.PhasePrefill, slice, func(i int) bool {
				switch {
				case i == 10: // the tenant's own job of two slices
					jobDone = h.submitPhase(dec, tc.last, slice, func(i int) bool { return i < 2 })
				case i > 10 && arrived < 0 && len(jobDone) > 0: // then its charge
					arrived = i
					h.wg.Go(func() {
						if tc.plain {
							charged <- h.s.run(dec, func() (int, bool, error) { return 0, false, nil })
						} else {
							charged <- h.s.runCharge(dec)
						}
					})
					for !h.queued(dec.name, charged) {
						time.Sleep(50 * time.Microsecond)
					}
				case arrived >= 0 && wait < 0 && slicesOf() == 3:
					wait = i - arrived - 1
				}
				return i < 100
			})
			for _, c := range []<-chan error{bulk, charged} {
				if err := <-c; err != nil {
					t.Fatal(err)
				}
			}
			if wait < tc.minWait || wait > tc.maxWait {
				t.Errorf("the charge waited for %d bulk slices, want %d to %d", wait, tc.minWait, tc.maxWait)
			}
		})
	}
}

// TestSchedDecodeEndsAnticipation: decode work next by virtual time does
// not wait while the device anticipates another tenant's next job. Tenant
// c (weight 10) has requests waiting when its job ends, so the device
// would wait for it, c being behind d in virtual time; d's decode job,
// queued meanwhile, runs at once instead.
func TestSchedDecodeEndsAnticipation(t *testing.T) {
	h := newSchedHarness(t)
	h.hold()
	start := h.clock.now()
	var second <-chan error
	d := tenantShare{name: "d"}
	first := h.submitPhase(d, api.PhaseDecode, time.Millisecond, func(int) bool { return false })
	c := h.submit(tenantShare{name: "c", weight: 10, waiting: func() bool { return true }}, time.Millisecond, func(int) bool {
		second = h.submitPhase(d, api.PhaseDecode, time.Millisecond, func(int) bool { return false })
		return false
	})
	h.release()
	if err := errors.Join(<-first, <-c); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if idle := h.clock.now() - start - 3*time.Millisecond; idle != 0 {
		t.Fatalf("the device idled %v in front of a decode job next by virtual time, anticipating another tenant", idle)
	}
}
