package mediator

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// A live import made again (as after its node connection dropped) leaves
// the range's mode, write access and page size as they were, which its
// streams read with no lock: run with -race, a write of them by the
// reimport is reported against this test's unlocked reads.
func TestReimportLeavesLiveRangeFields(t *testing.T) {
	_, hb, a, b := twoHosts(t, nil)
	p, err := a.Malloc(0, 130<<10)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeCoherent, api.Grant{Tenant: "shared", Write: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Import(sh); err != nil {
		t.Fatal(err)
	}
	hb.med.mu.Lock()
	s := hb.med.sessions[b.Session()]
	hb.med.mu.Unlock()
	rs := s.shares.list()
	if len(rs) != 1 || !rs[0].imported {
		t.Fatalf("the importer's shares: %d ranges, want its import", len(rs))
	}
	r := rs[0]
	mode, write, pageSize := r.mode, r.write, r.pageSize
	// The reader reads before, during and after the imports made again:
	// nothing orders its reads after them (stop is set only at the end).
	var stop atomic.Bool
	var reads atomic.Int64
	started := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // a stream's reads
		for !stop.Load() {
			if r.mode != mode || r.write != write || r.pageSize != pageSize {
				t.Errorf("the live range's fields changed under its reader")
			}
			if reads.Add(1) == 1 {
				close(started)
			}
		}
	})
	<-started
	for range 3 {
		s.issueMu.Lock()
		s.remakeImport(r, hb.med.node(r.node).addr, "in a test, the", false)
		s.issueMu.Unlock()
		if err := r.ended.Load(); err != nil {
			t.Fatalf("the import made again: %v", *err)
		}
	}
	for n := reads.Load(); reads.Load() == n; { // it reads after them too
		runtime.Gosched()
	}
	stop.Store(true)
	wg.Wait()
}
