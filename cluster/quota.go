package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vgpu/vgpu/api"
)

// Defaults of QuotaOptions.
const (
	// DefaultChunk is the least a mediator adds to its reservation of a
	// tenant's memory when it must ask etcd: admissions that fit in what it
	// already holds cost no round trip.
	DefaultChunk = 64 << 20
	// DefaultTrimAfter is how long a reservation may hold memory or
	// container slots its admissions no longer use before it gives them
	// back, so that another mediator can have them.
	DefaultTrimAfter = 2 * time.Second
)

// Reservation is what one mediator holds of one tenant's caps.
type Reservation struct {
	Memory     uint64 `json:"memory"`
	Containers int    `json:"containers"`
}

// Limits are the caps a reservation is checked against; 0 means none.
type Limits struct {
	Memory        uint64
	MaxContainers int
}

// QuotaOptions tune a mediator's reservations.
type QuotaOptions struct {
	// ID names the mediator's reservations; unique among live mediators.
	ID        string
	Chunk     uint64        // default DefaultChunk
	TrimAfter time.Duration // default DefaultTrimAfter
}

// Quotas is one mediator's share of every tenant's caps: it admits from
// what it has reserved in etcd, and reserves more, in chunks, when an
// admission does not fit. It is safe for concurrent use.
type Quotas struct {
	s    *Session
	opts QuotaOptions

	mu      sync.Mutex // guards tenants (the map, not the states)
	tenants map[string]*tenantState

	kick chan struct{} // wakes the trimmer
	// ctx ends with Close, and with it a trim in flight: a mediator
	// stopping while etcd is unreachable does not wait for it.
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
}

// tenantState is one tenant's reservation by this mediator.
type tenantState struct {
	// mu guards the fields below and is held across this tenant's etcd
	// round trips, so that its reservation's writes keep their order.
	mu sync.Mutex
	// used is what this mediator's admissions hold.
	used Reservation
	// held is what this mediator may admit from without asking etcd: at
	// most what its key in etcd says (a write whose outcome is unknown
	// counts as having lowered, and not having raised, it).
	held Reservation
	// dirty: the key in etcd may say more than held; the trimmer rewrites it.
	dirty bool
	grew  time.Time // when held last grew
	// others is the sum of the other mediators' reservations as last
	// read, at revision rev (0: never read).
	others Reservation
	rev    int64
}

// NewQuotas starts reserving for mediator opts.ID under s's lease. A new
// lease (after the old one was lost) gets back what the admissions use.
func NewQuotas(s *Session, opts QuotaOptions) (*Quotas, error) {
	if opts.ID == "" || strings.Contains(opts.ID, "/") {
		return nil, fmt.Errorf("cluster: mediator id %q: want a name without '/': %w", opts.ID, api.ErrInvalidArgument)
	}
	opts.Chunk = cmp.Or(opts.Chunk, DefaultChunk)
	opts.TrimAfter = cmp.Or(opts.TrimAfter, DefaultTrimAfter)
	q := &Quotas{s: s, opts: opts, tenants: map[string]*tenantState{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	q.ctx, q.stop = context.WithCancel(context.Background())
	s.OnNewLease(q.renew)
	go q.trimLoop()
	return q, nil
}

func (q *Quotas) state(tenant string) *tenantState {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.tenants[tenant]
	if ts == nil {
		ts = &tenantState{}
		q.tenants[tenant] = ts
	}
	return ts
}

func (q *Quotas) prefix(tenant string) string { return q.s.key("reserve", tenant) + "/" }
func (q *Quotas) key(tenant string) string    { return q.prefix(tenant) + q.opts.ID }

// Reserve admits mem bytes and ctrs containers of tenant against lim,
// cluster-wide. From what this mediator already holds it admits without a
// round trip, while its lease is certainly alive (Session.Valid); else it
// grows its reservation in one etcd transaction (more when other mediators
// changed theirs meanwhile), by at least a chunk of memory where the cap
// leaves room, by exactly what is asked where it does not, or where
// containers are asked for (each container is a round trip anyway: their
// count is reserved exactly).
//
// It fails with api.ErrQuotaExceeded when the tenant's reservations of all
// mediators, read at one revision, leave too little, and with
// api.ErrUnavailable when etcd does not answer within Options.OpTimeout.
// On failure nothing is admitted.
func (q *Quotas) Reserve(tenant string, lim Limits, mem uint64, ctrs int) error {
	ts := q.state(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	want := Reservation{ts.used.Memory + mem, ts.used.Containers + ctrs}
	// over: a cap lowered since the chunk was reserved binds at once.
	if want.Memory <= ts.held.Memory && want.Containers <= ts.held.Containers && q.s.Valid() && over(tenant, ts.others, want, lim) == nil {
		ts.used = want
		return nil
	}
	lease := q.s.Lease()
	if lease == 0 {
		return q.s.unavailable("reserve for tenant "+tenant, fmt.Errorf("no lease (etcd unreachable)"))
	}
	ctx, cancel := q.s.opContext()
	defer cancel()
	fresh := false // others and rev were read during this call
	for {
		if ts.rev == 0 {
			if err := q.readOthers(ctx, tenant, ts); err != nil {
				return err
			}
			fresh = true
		}
		if err := over(tenant, ts.others, want, lim); err != nil {
			if !fresh { // refuse only on a sum read now
				ts.rev = 0
				continue
			}
			return err
		}
		target := Reservation{max(ts.held.Memory, roundUp(want.Memory, q.opts.Chunk)), max(ts.held.Containers, want.Containers)}
		// A container costs a round trip anyway (its count is exact), so
		// a chunk would only hold memory that others could use.
		if ctrs > 0 || over(tenant, ts.others, target, lim) != nil {
			target.Memory = max(ts.held.Memory, want.Memory)
		}
		b, _ := json.Marshal(target)
		prefix := q.prefix(tenant)
		resp, err := q.s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(prefix), "<", ts.rev+1).WithPrefix()).
			Then(clientv3.OpPut(q.key(tenant), string(b), clientv3.WithLease(lease))).
			Else(clientv3.OpGet(prefix, clientv3.WithPrefix())).
			Commit()
		if err != nil {
			// The write may have been applied: held stays (the lower
			// bound), and the trimmer rewrites the key.
			ts.dirty = true
			return q.s.unavailable("reserve for tenant "+tenant, err)
		}
		if resp.Succeeded {
			ts.held, ts.used, ts.grew, ts.rev = target, want, time.Now(), resp.Header.Revision
			return nil
		}
		ts.others = q.sumOthers(resp.Responses[0].GetResponseRange().Kvs, prefix)
		ts.rev = resp.Header.Revision
		fresh = true
	}
}

// over says, as a quota error, whether mine on top of others passes lim.
func over(tenant string, others, mine Reservation, lim Limits) error {
	if lim.Memory > 0 && (others.Memory > lim.Memory || mine.Memory > lim.Memory-others.Memory) {
		return fmt.Errorf("tenant %q: cluster-wide, this mediator would hold %d bytes (%s) and the others hold %d bytes (%s), cap %d bytes (%s): %w",
			tenant, mine.Memory, api.FormatSize(mine.Memory), others.Memory, api.FormatSize(others.Memory), lim.Memory, api.FormatSize(lim.Memory), api.ErrQuotaExceeded)
	}
	if lim.MaxContainers > 0 && others.Containers+mine.Containers > lim.MaxContainers {
		return fmt.Errorf("tenant %q: cluster-wide, this mediator would hold %d containers and the others hold %d, max_containers is %d: %w",
			tenant, mine.Containers, others.Containers, lim.MaxContainers, api.ErrQuotaExceeded)
	}
	return nil
}

func roundUp(n, chunk uint64) uint64 {
	if r := n % chunk; r != 0 && n+chunk-r > n {
		return n + chunk - r
	}
	return n
}

// readOthers reads the other mediators' reservations of tenant.
func (q *Quotas) readOthers(ctx context.Context, tenant string, ts *tenantState) error {
	prefix := q.prefix(tenant)
	resp, err := q.s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return q.s.unavailable("read the reservations of tenant "+tenant, err)
	}
	ts.others, ts.rev = q.sumOthers(resp.Kvs, prefix), resp.Header.Revision
	return nil
}

// sumOthers adds up the reservations under prefix but this mediator's. A
// malformed one (by hand, by an older version) is logged and counted as
// the whole of any cap: no tenant goes over its cap through an entry this
// mediator cannot read.
func (q *Quotas) sumOthers(kvs []*mvccpb.KeyValue, prefix string) Reservation {
	var sum Reservation
	for _, kv := range kvs {
		id := strings.TrimPrefix(string(kv.Key), prefix)
		if id == q.opts.ID {
			continue
		}
		var r Reservation
		if err := json.Unmarshal(kv.Value, &r); err != nil || r.Containers < 0 {
			q.s.log.WithField("key", string(kv.Key)).Warn("cluster: a malformed reservation counts as holding everything until it is fixed or expires")
			r = Reservation{Memory: 1 << 62, Containers: 1 << 30}
		}
		sum.Memory = min(sum.Memory+r.Memory, 1<<62) // no wrap to a small sum
		sum.Containers = min(sum.Containers+r.Containers, 1<<30)
	}
	return sum
}

// Release returns mem bytes and ctrs containers of tenant that Reserve
// admitted. Container slots go back to etcd at once, unused memory after
// TrimAfter (both by the trimmer, without blocking the caller).
func (q *Quotas) Release(tenant string, mem uint64, ctrs int) {
	ts := q.state(tenant)
	ts.mu.Lock()
	ts.used.Memory -= min(mem, ts.used.Memory)
	ts.used.Containers -= min(ctrs, ts.used.Containers)
	ts.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Restore counts mem bytes and ctrs containers of tenant that an earlier
// run of this mediator admitted (restored after a restart), without
// checking the caps: they are in use. The trimmer writes them to etcd.
func (q *Quotas) Restore(tenant string, mem uint64, ctrs int) {
	ts := q.state(tenant)
	ts.mu.Lock()
	ts.used.Memory += mem
	ts.used.Containers += ctrs
	ts.dirty = true
	ts.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Used is what this mediator's admissions hold of tenant now.
func (q *Quotas) Used(tenant string) Reservation {
	ts := q.state(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.used
}

// Usage reads every tenant's reservations summed over all live mediators.
func (q *Quotas) Usage(ctx context.Context) (map[string]Reservation, error) {
	return q.s.Usage(ctx)
}

// Usage reads every tenant's reservations summed over all live mediators.
func (s *Session) Usage(ctx context.Context) (map[string]Reservation, error) {
	prefix := s.key("reserve") + "/"
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, s.unavailable("read reservations", err)
	}
	out := map[string]Reservation{}
	for _, kv := range resp.Kvs {
		tenant, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		var r Reservation
		if !ok || json.Unmarshal(kv.Value, &r) != nil {
			s.log.WithField("key", string(kv.Key)).Warn("cluster: ignoring a malformed reservation in the usage report")
			continue
		}
		u := out[tenant]
		u.Memory += r.Memory
		u.Containers += r.Containers
		out[tenant] = u
	}
	return out, nil
}

// trimLoop gives back what reservations hold beyond their admissions: at
// once for container slots, after TrimAfter for memory.
func (q *Quotas) trimLoop() {
	defer close(q.done)
	tick := time.NewTicker(q.opts.TrimAfter / 2)
	defer tick.Stop()
	for {
		select {
		case <-q.ctx.Done():
			return
		case <-tick.C:
		case <-q.kick:
		}
		q.mu.Lock()
		names := make([]string, 0, len(q.tenants))
		for name := range q.tenants {
			names = append(names, name)
		}
		q.mu.Unlock()
		for _, name := range names {
			q.trim(name)
		}
	}
}

// trim writes tenant's key down to what its admissions use, when it holds
// spare container slots, spare memory for TrimAfter, or may say more than
// held (dirty).
func (q *Quotas) trim(tenant string) {
	ts := q.state(tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	spare := ts.held.Containers > ts.used.Containers || (ts.held.Memory > ts.used.Memory && time.Since(ts.grew) >= q.opts.TrimAfter)
	if !spare && !ts.dirty {
		return
	}
	lease := q.s.Lease()
	if lease == 0 {
		return // the key went with the lease; renew puts back used
	}
	// Lowered before the write: should it fail after taking effect, held
	// still bounds what etcd says.
	ts.held, ts.dirty = ts.used, true
	ctx, cancel := context.WithTimeout(q.ctx, q.s.opts.OpTimeout)
	defer cancel()
	var err error
	if ts.used == (Reservation{}) {
		_, err = q.s.cli.Delete(ctx, q.key(tenant))
	} else {
		b, _ := json.Marshal(ts.used)
		_, err = q.s.cli.Put(ctx, q.key(tenant), string(b), clientv3.WithLease(lease))
	}
	if err != nil {
		if q.ctx.Err() == nil {
			q.s.log.WithError(err).WithField("tenant", tenant).Warn("cluster: giving back an unused reservation failed; retrying")
		}
		return
	}
	ts.dirty = false
}

// renew puts back, under a new lease, what the admissions use: the lost
// lease's expiry deleted every reservation of this mediator. The memory is
// in use, so it is written whatever the others hold meanwhile; a tenant
// then over its cap admits nothing more until it is under (docs/cluster.md).
func (q *Quotas) renew(ctx context.Context, lease clientv3.LeaseID) error {
	q.mu.Lock()
	states := make(map[string]*tenantState, len(q.tenants))
	for name, ts := range q.tenants {
		states[name] = ts
	}
	q.mu.Unlock()
	for name, ts := range states {
		ts.mu.Lock()
		ts.held, ts.rev = ts.used, 0
		var err error
		if ts.used != (Reservation{}) {
			b, _ := json.Marshal(ts.used)
			_, err = q.s.cli.Put(ctx, q.key(name), string(b), clientv3.WithLease(lease))
		}
		ts.dirty = err != nil
		ts.mu.Unlock()
		if err != nil {
			return q.s.unavailable("put back the reservation of tenant "+name, err)
		}
	}
	return nil
}

// Close stops the trimmer. The reservations go with the session's lease.
func (q *Quotas) Close() {
	q.stop()
	<-q.done
}
