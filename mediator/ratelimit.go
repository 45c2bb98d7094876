package mediator

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Bandwidth caps: one token bucket per tenant on the bytes its streams copy.
//
// A tenant's rate is its quota file's bandwidth, read again at every charge
// (so a reload takes effect at the next copy); a tenant the file does not
// name gets Config.TenantBandwidth. 0 means no cap. Every session of a
// tenant, on the host socket or a container's, charges the same bucket.
//
// What is charged: the bytes of copies to the device, from the device and
// between device buffers (memset and kernels are not copies), and, for a
// copy from a shared buffer, whatever else crosses the node link for it:
// each page it misses in the mediator's cache is read whole from the node,
// so its read pays for the rest of the page before it is sent
// (readShared), while a hit pays only the bytes copied. A stream
// charges a command before it translates and issues it, outside
// session.issueMu, so a wait holds up that stream alone: not the session's
// reader (until the stream's queue is full, which is the backpressure every
// stream has), not the session's other streams beyond their share of the
// bucket, and never another tenant. A wait ends early when the session ends;
// the command then fails with api.ErrUnavailable and nothing is issued.
//
// The bucket holds at most burst bytes, burstFor(rate): an eighth of a
// second at the rate, and at least one chunk (wire.MaxChunk), so that every
// frame a tenant can send fits in it. A charge larger than the burst (a big
// device-to-device copy) waits until the bucket has refilled for all of it.
// Over any window of time the bytes let through are at most
// rate × window + burst (ratelimit_test.go checks this against a fake clock).
//
// Buckets live while their tenant has sessions, and after its last one ends
// until they would be full again: a tenant that reconnects sooner finds its
// bucket as it left it, never a fresh burst; one that comes back later finds
// a full bucket, which is what it would have had anyway.

// burstFor is the bucket size for rate bytes per second.
func burstFor(rate uint64) uint64 { return max(rate/8, wire.MaxChunk) }

// bucket is a token bucket in the form of a virtual scheduling time (GCRA):
// empty is the instant, in nanoseconds of the mediator's clock, at which the
// bucket would be empty if nothing refilled it past it. At time t it holds
// min(burst, rate × (t − empty)) bytes. All arithmetic is in whole
// nanoseconds, rounding what a charge costs up and what the burst is worth
// down, so the bucket never lets through more than its rate and burst allow.
type bucket struct {
	mu    sync.Mutex
	rate  uint64 // bytes per second; 0: unlimited
	burst uint64
	empty int64
}

// emptyLongAgo is empty for a full bucket, far from overflow either way.
const emptyLongAgo = math.MinInt64 / 4

// costNs is n bytes at rate bytes per second, in nanoseconds, rounded up
// (or down); it saturates well below overflow.
func costNs(n, rate uint64, up bool) int64 {
	const limit = math.MaxInt64 / 4
	hi, lo := bits.Mul64(n, uint64(time.Second))
	if hi >= rate {
		return limit
	}
	q, r := bits.Div64(hi, lo, rate)
	if up && r != 0 {
		q++
	}
	return int64(min(q, limit))
}

// reserve charges n bytes at time now (ns) at rate, and returns the time at
// which they may pass: now if the bucket holds them, else later. Charges
// are served in the order they are made. A changed rate applies from this
// charge on; a rate of 0 lets everything through at once.
func (b *bucket) reserve(rate, n uint64, now int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rate != b.rate {
		if b.rate == 0 {
			b.empty = emptyLongAgo // a new cap starts with a full bucket
		}
		b.rate, b.burst = rate, burstFor(rate)
	}
	if rate == 0 || n == 0 {
		return now
	}
	if full := now - costNs(b.burst, rate, false); b.empty < full {
		b.empty = full
	}
	b.empty += costNs(n, rate, true)
	return max(now, b.empty)
}

// refund gives back n bytes reserved at rate that never passed. Charges
// made since keep their times; later ones find the bucket fuller. Nothing
// is given back if the rate has changed since.
func (b *bucket) refund(rate, n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rate == 0 || rate != b.rate {
		return
	}
	b.empty -= costNs(n, rate, false)
}

// fullAt is the time (ns) from which the bucket holds its whole burst.
func (b *bucket) fullAt() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate == 0 {
		return emptyLongAgo
	}
	return b.empty + costNs(b.burst, b.rate, true)
}

// epoch is the origin of the buckets' clock.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// limiter is a tenant's bucket as its sessions share it.
type limiter struct {
	m      *Mediator
	tenant string
	b      bucket
	// inflight counts the tenant's commands in flight over all its
	// sessions, at most maxTenantInflight (limits.go). It lives here
	// because the limiter is the tenant's one object shared by its
	// sessions, kept while any of them lives.
	inflight bound
	refs     int         // under limiters.mu
	expiry   *time.Timer // under limiters.mu: forgets it once full, while unused
}

type limiterKey struct {
	m      *Mediator
	tenant string
}

// limiters holds the buckets of tenants with live sessions, per mediator,
// and of tenants whose last session ended before their bucket refilled: an
// entry goes once its tenant has no session and its bucket is full, or
// when its mediator closes.
var limiters = struct {
	sync.Mutex
	m map[limiterKey]*limiter
}{m: map[limiterKey]*limiter{}}

// limiter returns tenant's bucket, counting one more session that uses it;
// the session releases it when it ends.
func (m *Mediator) limiter(tenant string) *limiter {
	limiters.Lock()
	defer limiters.Unlock()
	k := limiterKey{m, tenant}
	l := limiters.m[k]
	if l == nil {
		l = &limiter{m: m, tenant: tenant, b: bucket{empty: emptyLongAgo}, inflight: bound{limit: maxTenantInflight}}
		limiters.m[k] = l
	}
	l.refs++
	return l
}

func (l *limiter) release() {
	limiters.Lock()
	defer limiters.Unlock()
	if l.refs--; l.refs == 0 {
		l.forgetWhenFull()
	}
}

// forgetWhenFull drops an unused limiter now if its bucket is full, else
// once it will be, on its one timer. Called with limiters held.
func (l *limiter) forgetWhenFull() {
	if d := time.Duration(l.b.fullAt() - monoNow()); d > 0 {
		if l.expiry == nil {
			l.expiry = time.AfterFunc(d, func() {
				limiters.Lock()
				defer limiters.Unlock()
				if l.refs == 0 {
					l.forgetWhenFull() // used and charged again meanwhile: later
				}
			})
		} else {
			l.expiry.Reset(d)
		}
		return
	}
	if k := (limiterKey{l.m, l.tenant}); limiters.m[k] == l {
		delete(limiters.m, k)
	}
}

// forgetLimiters drops the limiters of m, which has closed (so none is in
// use), and stops their timers.
func forgetLimiters(m *Mediator) {
	limiters.Lock()
	defer limiters.Unlock()
	for k, l := range limiters.m {
		if k.m == m {
			if l.expiry != nil {
				l.expiry.Stop()
			}
			delete(limiters.m, k)
		}
	}
}

// bandwidth is the tenant's cap in bytes per second now (0: none).
func (m *Mediator) bandwidth(tenant string) uint64 {
	if q := m.admission.Limits(tenant); q != nil {
		return q.Bandwidth
	}
	return m.cfg.TenantBandwidth
}

// wait charges n bytes and waits until they may pass, or until done is
// closed (the session ends), which fails with api.ErrUnavailable. If it
// must wait, it calls before first.
func (l *limiter) wait(n uint64, done <-chan struct{}, before func()) error {
	select {
	case <-done: // the session is ending: charge nothing that will not move
		return fmt.Errorf("session of tenant %q ended before %d bytes were copied: %w", l.tenant, n, api.ErrUnavailable)
	default:
	}
	rate := l.m.bandwidth(l.tenant)
	if rate == 0 {
		// No cap: nothing to wait for, and no clock to read (the bucket
		// only notes that the cap is off).
		l.b.reserve(0, n, 0)
		return nil
	}
	at := l.b.reserve(rate, n, monoNow())
	d := time.Duration(at - monoNow())
	if d <= 0 {
		return nil
	}
	if before != nil {
		before()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-done:
		l.b.refund(rate, n) // they never move: the tenant's other sessions need not wait for them
		return fmt.Errorf("session of tenant %q ended while %d bytes waited for bandwidth: %w", l.tenant, n, api.ErrUnavailable)
	}
}
