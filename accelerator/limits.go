package accelerator

import (
	"math"
	"sync/atomic"
)

// A tenant's weight and compute cap on this node.
//
// Mediators send the tenant, weight and compute_max of each connection in
// its Hello, from their own quota files. Mediators that share a node should
// share one quota file; where they do not (a file being rolled out, a
// mistake), the node does not let the most generous one win: every
// connection of a tenant counts with the least weight and the least cap
// that any of its live connections was given, and the node logs the
// disagreement when a connection brings it. A connection's values count
// from its hello to its end.
//
// Invariants: Node.tenants has an entry for a tenant exactly while one of
// its connections is between its hello and its end, and each entry's
// weight and cap are the least over its from, normalized (tenantShare).

// tenantLimits is one tenant's weight and cap, shared by the tenantShare of
// each of its connections, so that a connection's hello or end changes
// them for all.
type tenantLimits struct {
	from       map[owner]limit // the live connections' own; guarded by Node.mu
	weight     atomic.Uint32   // at least 1
	computeMax atomic.Uint32   // float32 bits; 1: no cap
}

// limit is a weight and cap as a Hello gives them.
type limit struct {
	weight     uint32
	computeMax float32
}

// normalized is l as the scheduler counts it: weight at least 1, and a cap
// of 1 for none (≤ 0, ≥ 1 or NaN).
func (l limit) normalized() limit {
	if !(l.computeMax > 0 && l.computeMax < 1) {
		l.computeMax = 1
	}
	return limit{max(l.weight, 1), l.computeMax}
}

// get returns the weight and cap in force.
func (t *tenantLimits) get() (uint32, float32) {
	return t.weight.Load(), math.Float32frombits(t.computeMax.Load())
}

// update sets the weight and cap in force to the least over t.from, and
// says whether its connections were given different ones. The caller holds
// Node.mu.
func (t *tenantLimits) update() (disagree bool) {
	least := limit{math.MaxUint32, 1}
	first := true
	var seen limit
	for _, l := range t.from {
		l = l.normalized()
		if !first && l != seen {
			disagree = true
		}
		first, seen = false, l
		least = limit{min(least.weight, l.weight), min(least.computeMax, l.computeMax)}
	}
	t.weight.Store(least.weight)
	t.computeMax.Store(math.Float32bits(least.computeMax))
	return disagree
}

// joinTenant counts the weight and cap that connection o was given toward
// its tenant's, and returns the tenant's limits, and whether its
// connections now disagree.
func (n *Node) joinTenant(tenant string, o owner, l limit) (*tenantLimits, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.tenants[tenant]
	if t == nil {
		t = &tenantLimits{from: map[owner]limit{}}
		n.tenants[tenant] = t
	}
	t.from[o] = l
	return t, t.update()
}

// leaveTenant stops counting connection o, which ended, toward its
// tenant's weight and cap.
func (n *Node) leaveTenant(tenant string, o owner) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.tenants[tenant]
	if t == nil {
		return
	}
	delete(t.from, o)
	if len(t.from) == 0 {
		delete(n.tenants, tenant)
		return
	}
	t.update()
}
