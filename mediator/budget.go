package mediator

import (
	"fmt"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
)

// budget is a memory allowance shared by the sessions it covers: one
// container's sessions, or one host session. Reservations are in allocation
// footprints (bytes rounded to pages), less the credit a sealed weight
// earns for frames the node stores once (dedup.go): an allocation reserves
// its footprint in full, its seal may release part of it (the credit, which
// the session records), and its free releases the footprint less that
// credit. So the sum of live reservations equals the sum over live
// allocations of footprint − credit, and is 0 when none is left.
//
// budget.mu is a leaf: it is taken under Mediator.mu (tenantsJSON) and
// session.issueMu, and nothing is locked under it.
type budget struct {
	owner string             // for messages: `container "abc" of tenant "t"`
	limit uint64             // 0: no limit
	log   logrus.FieldLogger // for accounting drift; nil: logrus's standard logger
	// cluster, when set, charges what the budget reserves to its tenant
	// cluster-wide too (a host session's, in cluster mode: cluster.go);
	// called with mu released.
	cluster *clusterCharge

	mu   sync.Mutex
	used uint64
}

func (b *budget) reserve(n uint64) error {
	b.mu.Lock()
	if b.limit != 0 && n > b.limit-b.used {
		defer b.mu.Unlock()
		return fmt.Errorf("%s: %d more bytes would exceed its memory limit of %d (%d in use): %w",
			b.owner, n, b.limit, b.used, api.ErrQuotaExceeded)
	}
	b.used += n
	b.mu.Unlock()
	if b.cluster != nil {
		if err := b.cluster.reserve(n); err != nil {
			b.mu.Lock()
			b.used -= n
			b.mu.Unlock()
			return fmt.Errorf("%s: %w", b.owner, err)
		}
	}
	return nil
}

// release gives back n reserved bytes. Releasing more than is reserved is
// a bug of the mediator's accounting; it is logged and the budget counted
// empty, since taking the mediator down would end every tenant's sessions.
func (b *budget) release(n uint64) {
	n = b.releaseLocal(n)
	if b.cluster != nil {
		b.cluster.release(n)
	}
}

// releaseLocal is release but for the cluster-wide charge; it returns the
// bytes released.
func (b *budget) releaseLocal(n uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.used {
		log := b.log
		if log == nil {
			log = logrus.StandardLogger()
		}
		log.WithFields(logrus.Fields{"budget": b.owner, "releasing": n, "reserved": b.used}).
			Error("budget accounting drift: releasing more bytes than are reserved; counting none reserved")
		n = b.used
	}
	b.used -= n
	return n
}

// inUse is what the budget holds reserved now.
func (b *budget) inUse() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
