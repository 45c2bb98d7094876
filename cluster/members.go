package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vgpu/vgpu/api"
)

// NodeInfo is a node's registry entry: where mediators reach it and what it
// offers. Free and Connections are refreshed while it runs (Registration.Update).
type NodeInfo struct {
	Addr    string `json:"addr"`    // host:port mediators dial
	Backend string `json:"backend"` // sim, cuda
	// TLS is the subject of the node's certificate when it serves mutual
	// TLS, "" for plain TCP.
	TLS         string       `json:"tls,omitempty"`
	Devices     []DeviceInfo `json:"devices"`
	Connections int          `json:"connections"`
	Version     string       `json:"version,omitempty"`
}

// DeviceInfo is one device of a node: its capacity and how much is free.
type DeviceInfo struct {
	Index  uint32 `json:"index"`
	Name   string `json:"name"`
	Memory uint64 `json:"memory"` // bytes
	Free   uint64 `json:"free"`   // bytes an allocation may have now
}

// MediatorInfo is a mediator's registry entry.
type MediatorInfo struct {
	ID      string    `json:"id"`
	Host    string    `json:"host"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started"`
}

// Kinds of member, the second component of their keys.
const (
	kindNodes     = "nodes"
	kindMediators = "mediators"
)

// check says what is wrong with an entry read back from the registry.
func (n NodeInfo) check(key string) error {
	if n.Addr == "" || key != n.Addr {
		return fmt.Errorf("node entry %q names address %q: %w", key, n.Addr, api.ErrInvalidArgument)
	}
	if len(n.Devices) == 0 {
		return fmt.Errorf("node entry %q has no devices: %w", key, api.ErrInvalidArgument)
	}
	for _, d := range n.Devices {
		if d.Memory == 0 || d.Free > d.Memory {
			return fmt.Errorf("node entry %q: device %d: memory %d, free %d: %w", key, d.Index, d.Memory, d.Free, api.ErrInvalidArgument)
		}
	}
	return nil
}

func (m MediatorInfo) check(key string) error {
	if m.ID == "" || key != m.ID {
		return fmt.Errorf("mediator entry %q names id %q: %w", key, m.ID, api.ErrInvalidArgument)
	}
	return nil
}

// Registration is an entry of this process in the registry, under the
// session's lease: put back under each new lease, gone with the lease.
type Registration struct {
	s   *Session
	key string

	mu    sync.Mutex // guards value; held across the put, so puts keep their order
	value []byte
}

// RegisterNode registers a node under the session's lease. It fails with
// api.ErrInvalidArgument when another live process has registered the same
// address: two nodes cannot both be reached at one address. An entry of a
// process that died is waited for until its lease expires (at most the TTL
// and an operation timeout), so a node restarted at once registers again.
func (s *Session) RegisterNode(info NodeInfo) (*Registration, error) {
	if err := info.check(info.Addr); err != nil {
		return nil, err
	}
	return s.register(kindNodes, info.Addr, info)
}

// RegisterMediator registers a mediator under the session's lease, failing
// like RegisterNode for an id registered by another live process.
func (s *Session) RegisterMediator(info MediatorInfo) (*Registration, error) {
	if err := info.check(info.ID); err != nil {
		return nil, err
	}
	return s.register(kindMediators, info.ID, info)
}

func (s *Session) register(kind, name string, v any) (*Registration, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("cluster: encode %s %q: %v: %w", kind, name, err, api.ErrInternal)
	}
	r := &Registration{s: s, key: s.key(kind, name), value: b}
	// A process restarted at once (a crash, a SIGKILL, an upgrade) finds
	// its predecessor's entry until that one's lease expires: wait that
	// long, then refuse, for then another live process holds the name.
	deadline := time.Now().Add(s.opts.TTL + s.opts.OpTimeout)
	for waited := false; ; waited = true {
		ctx, cancel := s.opContext()
		err = r.put(ctx, s.Lease())
		cancel()
		if err == nil || !errors.Is(err, errClaimed) || time.Now().After(deadline) {
			if err != nil {
				return nil, err
			}
			break
		}
		if !waited {
			s.log.WithField("key", r.key).Info("cluster: registered by another process; waiting for its lease to expire, should it be dead")
		}
		select {
		case <-s.ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
	s.OnNewLease(func(ctx context.Context, lease clientv3.LeaseID) error { return r.put(ctx, lease) })
	return r, nil
}

// errClaimed is put's refusal of a key another lease holds.
var errClaimed = errors.New("claimed")

// put writes the entry under lease unless a key of another lease holds it.
func (r *Registration) put(ctx context.Context, lease clientv3.LeaseID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lease == 0 {
		return r.s.unavailable("register "+r.key, fmt.Errorf("no lease (etcd unreachable)"))
	}
	resp, err := r.s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(clientv3.OpPut(r.key, string(r.value), clientv3.WithLease(lease))).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(r.key), "=", lease)},
			[]clientv3.Op{clientv3.OpPut(r.key, string(r.value), clientv3.WithLease(lease))},
			[]clientv3.Op{clientv3.OpGet(r.key)})).
		Commit()
	if err != nil {
		return r.s.unavailable("register "+r.key, err)
	}
	if resp.Succeeded {
		return nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner.Succeeded {
		return nil
	}
	owner := "?"
	if kvs := inner.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		owner = fmt.Sprintf("%x", kvs[0].Lease)
	}
	return fmt.Errorf("cluster: %s is registered by another live process (lease %s): %w: %w", r.key, owner, errClaimed, api.ErrInvalidArgument)
}

// Update replaces the entry's value (a node's free memory, say).
func (r *Registration) Update(v any) error {
	ctx, cancel := r.s.opContext()
	defer cancel()
	return r.update(ctx, v)
}

// update is Update within ctx.
func (r *Registration) update(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("cluster: encode %s: %v: %w", r.key, err, api.ErrInternal)
	}
	r.mu.Lock()
	same := string(b) == string(r.value)
	r.value = b
	r.mu.Unlock()
	if same {
		return nil
	}
	return r.put(ctx, r.s.Lease())
}

// KeepNode registers a node as RegisterNode does, with info() as its
// entry, and writes info() again every interval (when it changed: free
// memory, connections) until stop is called. A failed refresh is logged and
// retried at the next tick. stop ends the refreshes, an update in flight
// included, and returns once they ended; the entry itself goes with the
// session's lease (Close).
func (s *Session) KeepNode(info func() NodeInfo, interval time.Duration) (stop func(), err error) {
	reg, err := s.RegisterNode(info())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(s.ctx) // ended by stop, or by Close
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// Within the loop's context, so that stop ends an update in flight.
			opCtx, opCancel := context.WithTimeout(ctx, s.opts.OpTimeout)
			err := reg.update(opCtx, info())
			opCancel()
			if err != nil && ctx.Err() == nil {
				s.log.WithError(err).Warn("cluster: refreshing this node's entry failed; retrying")
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

// Nodes reads the registered nodes, skipping (and logging) malformed entries.
func (s *Session) Nodes(ctx context.Context) ([]NodeInfo, error) {
	m, _, err := list[NodeInfo](ctx, s, kindNodes)
	if err != nil {
		return nil, err
	}
	return slices.SortedFunc(maps.Values(m), func(a, b NodeInfo) int { return strings.Compare(a.Addr, b.Addr) }), nil
}

// Mediators reads the registered mediators, skipping malformed entries.
func (s *Session) Mediators(ctx context.Context) ([]MediatorInfo, error) {
	m, _, err := list[MediatorInfo](ctx, s, kindMediators)
	if err != nil {
		return nil, err
	}
	return slices.SortedFunc(maps.Values(m), func(a, b MediatorInfo) int { return strings.Compare(a.ID, b.ID) }), nil
}

// entry is a registry value that can say what is wrong with itself.
type entry interface {
	NodeInfo | MediatorInfo
	check(key string) error
}

// list reads every entry of kind, by name, and the revision read at.
func list[T entry](ctx context.Context, s *Session, kind string) (map[string]T, int64, error) {
	prefix := s.key(kind) + "/"
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, s.unavailable("list "+kind, err)
	}
	out := map[string]T{}
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), prefix)
		if v, ok := decodeEntry[T](s, name, kv.Value); ok {
			out[name] = v
		}
	}
	return out, resp.Header.Revision, nil
}

// decodeEntry decodes and checks an entry, logging and refusing a bad one.
func decodeEntry[T entry](s *Session, name string, b []byte) (T, bool) {
	var v T
	err := json.Unmarshal(b, &v)
	if err == nil {
		err = v.check(name)
	}
	if err != nil {
		s.log.WithError(err).WithField("entry", name).Warn("cluster: ignoring a malformed registry entry")
		return v, false
	}
	return v, true
}

// WatchNodes calls fn with every registered node now, and again after each
// change, until ctx ends: nodes that registered, updated, or whose lease
// expired. Malformed entries are logged and left out. When the watch
// breaks (etcd compacted past it, or was unreachable), the list is read
// again and the watch resumes from there.
func (s *Session) WatchNodes(ctx context.Context, fn func([]NodeInfo)) {
	watch(ctx, s, kindNodes, func(m map[string]NodeInfo) {
		fn(slices.SortedFunc(maps.Values(m), func(a, b NodeInfo) int { return strings.Compare(a.Addr, b.Addr) }))
	})
}

func watch[T entry](ctx context.Context, s *Session, kind string, fn func(map[string]T)) {
	prefix := s.key(kind) + "/"
	for ctx.Err() == nil {
		m, rev, err := list[T](ctx, s, kind)
		if err != nil {
			s.log.WithError(err).Warn("cluster: watch: reading the registry failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		fn(maps.Clone(m))
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		events := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range until(ctx, events) {
			if resp.Err() != nil {
				s.log.WithError(resp.Err()).Warn("cluster: watch broke; reading the registry again")
				break
			}
			for _, ev := range resp.Events {
				name := strings.TrimPrefix(string(ev.Kv.Key), prefix)
				if ev.Type == clientv3.EventTypeDelete {
					delete(m, name)
				} else if v, ok := decodeEntry[T](s, name, ev.Kv.Value); ok {
					m[name] = v
				} else {
					delete(m, name)
				}
			}
			fn(maps.Clone(m))
		}
		cancel()
	}
}

// until yields the responses of a watch until it closes or ctx ends. The
// client closes a cancelled watch's channel only once it reaches etcd, so
// a watcher that stops while etcd is unreachable must not wait for that.
func until(ctx context.Context, ch clientv3.WatchChan) iter.Seq[clientv3.WatchResponse] {
	return func(yield func(clientv3.WatchResponse) bool) {
		for {
			select {
			case <-ctx.Done():
				return
			case resp, ok := <-ch:
				if !ok || !yield(resp) {
					return
				}
			}
		}
	}
}
