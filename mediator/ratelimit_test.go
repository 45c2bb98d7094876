package mediator

import (
	"errors"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/isolation"
)

// TestBucketWindowBound checks the bucket against a fake clock: whatever the
// charges and their timing, the bytes let through in any window [t1, t2] of
// grant times are at most rate × (t2 − t1) + burst; and a steady stream of
// charges gets the full rate, not less (so rounding never starves).
func TestBucketWindowBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := rapid.Uint64Range(1, 1<<34).Draw(t, "rate")
		burst := burstFor(rate)
		b := bucket{empty: emptyLongAgo}
		type grant struct {
			at int64
			n  uint64
		}
		var grants []grant
		now := rapid.Int64Range(0, 1<<40).Draw(t, "start")
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for i := range steps {
			now += rapid.Int64Range(0, int64(2*time.Second)).Draw(t, "gap")
			n := rapid.Uint64Range(1, burst).Draw(t, "n")
			at := b.reserve(rate, n, now)
			if at < now {
				t.Fatalf("charge %d granted at %d, before it was made at %d", i, at, now)
			}
			if len(grants) > 0 && at < grants[len(grants)-1].at {
				t.Fatalf("charge %d granted at %d, before the one made earlier (%d)", i, at, grants[len(grants)-1].at)
			}
			grants = append(grants, grant{at, n})
			// a charger waits for its grant before it charges again
			now = max(now, at)
		}
		for i := range grants {
			var sum uint64
			for j := i; j < len(grants); j++ {
				sum += grants[j].n
				// sum ≤ rate × window + burst, in whole nanoseconds and
				// bytes: in floating point the two sides can round apart
				// by a byte at the boundary.
				ns := grants[j].at - grants[i].at
				lhs := new(big.Int).Mul(new(big.Int).SetUint64(sum), big.NewInt(1e9))
				rhs := new(big.Int).Mul(new(big.Int).SetUint64(rate), big.NewInt(ns))
				rhs.Add(rhs, new(big.Int).Mul(new(big.Int).SetUint64(burst), big.NewInt(1e9)))
				if lhs.Cmp(rhs) > 0 {
					t.Fatalf("grants %d..%d: %d bytes in %dns, more than rate %d × that + burst %d", i, j, sum, ns, rate, burst)
				}
			}
		}
	})
}

func TestBucketSteadyRate(t *testing.T) {
	const rate = 100 << 20
	b := bucket{empty: emptyLongAgo}
	now := int64(0)
	var sent uint64
	for now < int64(10*time.Second) {
		now = b.reserve(rate, wire.MaxChunk, now)
		sent += wire.MaxChunk
	}
	// 10 s at the rate plus the initial burst, within one chunk
	want := uint64(rate*10) + burstFor(rate)
	if sent+wire.MaxChunk < want || sent > want+wire.MaxChunk {
		t.Fatalf("sent %d bytes in 10s at %d/s (burst %d), want about %d", sent, rate, burstFor(rate), want)
	}
}

func TestBucketRateChange(t *testing.T) {
	b := bucket{empty: emptyLongAgo}
	if at := b.reserve(0, 1<<40, 5); at != 5 {
		t.Fatalf("unlimited bucket made a charge wait until %d", at)
	}
	// a cap appears: a full bucket, then waits at the new rate
	const rate = 1 << 20
	if at := b.reserve(rate, wire.MaxChunk, 10); at != 10 {
		t.Fatalf("first chunk under a new cap waited until %d", at)
	}
	if at := b.reserve(rate, wire.MaxChunk, 10); at != 10+int64(time.Second) {
		t.Fatalf("second chunk at 1 MiB/s granted at %d, want 1s later", at)
	}
	// the rate rises: the next charge is priced at the new rate
	at := b.reserve(4*rate, wire.MaxChunk, 10)
	if want := 10 + int64(time.Second) + int64(time.Second)/4; at != want {
		t.Fatalf("chunk after a rate rise granted at %d, want %d", at, want)
	}
	// the cap goes: nothing waits
	if at := b.reserve(0, 1<<40, 20); at != 20 {
		t.Fatalf("lifted cap still waits until %d", at)
	}
}

func TestCostNsSaturates(t *testing.T) {
	if c := costNs(^uint64(0), 1, true); c <= 0 {
		t.Fatalf("cost of 2^64 bytes at 1 B/s: %d", c)
	}
	if c := costNs(3, 2, true); c != 1500000000 {
		t.Fatalf("3 bytes at 2 B/s: %d ns", c)
	}
	if c := costNs(1, 3, true); c != 333333334 {
		t.Fatalf("1 byte at 3 B/s rounded up: %d ns", c)
	}
}

// TestLimiterOutlivesSessionsUntilFull: a tenant whose last session ends
// with its bucket drained gets the same bucket back when it reconnects (no
// fresh burst); one whose bucket is full, or has refilled, is forgotten.
func TestLimiterOutlivesSessionsUntilFull(t *testing.T) {
	m := &Mediator{}
	known := func(tenant string) *limiter {
		limiters.Lock()
		defer limiters.Unlock()
		return limiters.m[limiterKey{m, tenant}]
	}
	idle := m.limiter("idle")
	idle.release()
	if known("idle") != nil {
		t.Error("a tenant that never copied is kept after its last session")
	}

	// The burst, one chunk, refills in a second: a pause of this test
	// shorter than that does not refill the bucket under it.
	const rate = 1 << 20
	l := m.limiter("busy")
	burst := burstFor(rate)
	l.b.reserve(rate, burst, monoNow())
	l.release()
	again := m.limiter("busy")
	if again != l {
		t.Fatal("a reconnecting tenant got a fresh bucket while its old one was drained")
	}
	if at := again.b.reserve(rate, burst, monoNow()); at <= monoNow() {
		t.Error("a full burst passed at once right after the bucket was drained")
	}
	again.release()
	// Released again, it re-arms its one timer.
	for range 3 {
		m.limiter("busy").release()
	}
	deadline := time.Now().Add(10 * time.Second)
	for known("busy") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the limiter of a tenant without sessions is still kept after its bucket refilled")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bytes that never move cost the tenant's bucket nothing: a copy of a
// session already ending is not charged, and one whose wait the session's
// end cuts short is given back, so the tenant's other sessions do not wait
// for them.
func TestLimiterChargesOnlyBytesThatMove(t *testing.T) {
	const rate = 8 << 20
	m := &Mediator{cfg: Config{TenantBandwidth: rate}, admission: isolation.NewAdmission(isolation.Default())}
	l := m.limiter("t")
	defer l.release()
	ended := make(chan struct{})
	close(ended)
	if err := l.wait(64<<20, ended, nil); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a copy of an ended session: %v", err)
	}
	if at := l.b.reserve(rate, 1, monoNow()); at > monoNow() {
		t.Fatalf("an ended session's copy was charged: the next byte waits %v", time.Duration(at-monoNow()))
	}
	ending := make(chan struct{})
	waited := make(chan error, 1)
	go func() { waited <- l.wait(64<<20, ending, nil) }() // 8 s at the rate
	time.Sleep(50 * time.Millisecond)
	close(ending)
	if err := <-waited; !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a wait cut short: %v", err)
	}
	if at := l.b.reserve(rate, 1<<20, monoNow()); time.Duration(at-monoNow()) > time.Second {
		t.Fatalf("bytes that never moved were kept: 1 MiB waits %v", time.Duration(at-monoNow()))
	}
}

// TestLimitersGoWithTheirMediator: a closed mediator's drained buckets are
// not kept until they refill.
func TestLimitersGoWithTheirMediator(t *testing.T) {
	m := &Mediator{}
	l := m.limiter("t")
	l.b.reserve(1<<20, 64<<20, monoNow()) // a minute to refill
	l.release()
	forgetLimiters(m)
	limiters.Lock()
	defer limiters.Unlock()
	if got := limiters.m[limiterKey{m, "t"}]; got != nil {
		t.Error("a closed mediator's limiter is still kept")
	}
}

// A tenant removed from the quota file while its containers run keeps its
// caps for them: its bandwidth and its compute weight and cap on nodes stay
// those it had, until its last container is released.
func TestRemovedTenantKeepsCaps(t *testing.T) {
	parse := func(body string) *isolation.Config {
		t.Helper()
		cfg, err := isolation.Parse("q.toml", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	m := &Mediator{
		cfg:       Config{TenantBandwidth: 4 << 20},
		admission: isolation.NewAdmission(parse("[tenants.capped]\nbandwidth = \"8MiB\"\ncompute = 4\ncompute_max = 0.1\nmemory = \"1GiB\"\n")),
	}
	check := func(when string, bw uint64, weight uint32, cmax float32) {
		t.Helper()
		nt := m.nodeTenant("capped")
		if got := m.bandwidth("capped"); got != bw || nt.weight != weight || nt.computeMax != cmax {
			t.Fatalf("%s: bandwidth %d, weight %d, compute_max %g; want %d, %d, %g", when, got, nt.weight, nt.computeMax, bw, weight, cmax)
		}
	}
	if _, _, err := m.admission.Admit(isolation.Request{Namespace: "ns", Container: "c1", Tenant: "capped", Memory: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	check("configured", 8<<20, 4, 0.1)
	m.admission.SetConfig(parse("[tenants.other]\n"))
	check("removed, its container running", 8<<20, 4, 0.1)
	m.admission.SetConfig(parse("[tenants.other]\n"))
	check("after a second reload", 8<<20, 4, 0.1)
	m.admission.Release("ns", "c1")
	check("removed, its last container released", 4<<20, 1, 0)
}
