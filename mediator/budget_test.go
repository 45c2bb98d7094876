package mediator

import (
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/api"
)

// Releasing more than a budget holds is a bug of the mediator's accounting,
// not something to take every tenant's sessions down for: it is logged,
// naming the budget and both amounts, the budget is counted empty, and it
// serves on within its limit.
func TestBudgetDriftIsLoggedAndClamped(t *testing.T) {
	log, hook := test.NewNullLogger()
	b := &budget{owner: "container x", limit: 100, log: log}
	if err := b.reserve(40); err != nil {
		t.Fatal(err)
	}
	b.release(60)
	if n := b.inUse(); n != 0 {
		t.Fatalf("%d bytes reserved after releasing more than all, want 0", n)
	}
	e := hook.LastEntry()
	if e == nil || e.Level != logrus.ErrorLevel || e.Data["budget"] != "container x" || e.Data["releasing"] != uint64(60) || e.Data["reserved"] != uint64(40) {
		t.Fatalf("drift logged as %+v", e)
	}
	if err := b.reserve(100); err != nil {
		t.Fatalf("the whole limit after a drift: %v", err)
	}
	if err := b.reserve(1); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("past the limit after a drift: %v", err)
	}
}
