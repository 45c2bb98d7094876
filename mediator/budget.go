package mediator

import (
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// budget is a memory allowance shared by the sessions it covers: one
// container's sessions, or one host session. Reservations are in allocation
// footprints (bytes rounded to pages), so the sum of live reservations
// equals the sum of the footprints of live allocations.
type budget struct {
	owner string // for messages: `container "abc" of tenant "t"`
	limit uint64 // 0: no limit

	mu   sync.Mutex
	used uint64
}

func (b *budget) reserve(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit != 0 && n > b.limit-b.used {
		return fmt.Errorf("%s: %d more bytes would exceed its memory limit of %d (%d in use): %w",
			b.owner, n, b.limit, b.used, api.ErrQuotaExceeded)
	}
	b.used += n
	return nil
}

func (b *budget) release(n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.used {
		panic(fmt.Sprintf("budget of %s: releasing %d bytes with %d reserved", b.owner, n, b.used))
	}
	b.used -= n
}
