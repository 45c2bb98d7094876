package mediator_test

import (
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/mediator"
)

// A read of a shared buffer that misses the cache moves a whole 64 KiB page
// from the node: the tenant's bandwidth bucket pays for the page, not only
// for the byte it asked for, so one-byte reads of many pages move no more
// from the node than the cap allows. Hits pay only what they copy. While the
// tenant's stream waits for bandwidth its session's reader still answers,
// and another tenant's reads go on.
func TestSharedReadMissesChargeTheirPages(t *testing.T) {
	const (
		rate  = 8 << 20 // bytes per second
		burst = 1 << 20 // burstFor(rate): one chunk
		page  = 64 << 10
		pages = 192 // fewer than a stream's queue holds, so the reader is free
	)
	sys := startWith(t, 256<<20, func(c *mediator.Config) { c.TenantBandwidth = rate })
	h := sys.dial(t, "hostile", 1)
	p, err := h.Malloc(0, pages*page)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Export(p, api.ModeImmutable); err != nil { // sealed: cached for good
		t.Fatal(err)
	}
	v := sys.dial(t, "victim", 1)
	vp, _, _ := exportRandom(t, v, page, 7, api.ModeImmutable)

	st0, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	start := time.Now()
	s := h.Stream()
	for i := range uint64(pages) {
		s.CopyFromDevice(one, p.Add(i*page))
	}
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()

	// Meanwhile the hostile session's reader and another tenant are served.
	t0 := time.Now()
	if _, err := h.Stats(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Errorf("the stats of a session whose stream waits for bandwidth took %v", d)
	}
	t0 = time.Now()
	for range 4 {
		if _, err := read(t, v, vp, page); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Errorf("another tenant's reads of its shared buffer took %v beside a waiting stream", d)
	}

	if err := <-done; err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	st1, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	misses := st1.SharedMisses - st0.SharedMisses
	pulled := float64(misses * page)
	allowed := rate*el.Seconds() + burst + page
	t.Logf("%d one-byte reads: %d pages (%.1f MiB) from the node in %v, %.1f MiB/s at a cap of %d MiB/s",
		pages, misses, pulled/(1<<20), el, pulled/(1<<20)/el.Seconds(), rate>>20)
	if misses != pages {
		t.Fatalf("%d one-byte reads of distinct pages missed %d times, want %d", pages, misses, pages)
	}
	if pulled > allowed {
		t.Fatalf("reads pulled %.0f bytes from the node in %v: more than the cap allows (%.0f)", pulled, el, allowed)
	}

	// The same pages again are hits: a byte each is all they cost.
	start = time.Now()
	s = h.Stream()
	for i := range uint64(pages) {
		s.CopyFromDevice(one, p.Add(i*page))
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	el = time.Since(start)
	st2, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d one-byte hits: %v", pages, el)
	if st2.SharedMisses != st1.SharedMisses || st2.SharedHits-st1.SharedHits != pages {
		t.Fatalf("reading the pages again: %d misses, %d hits; want 0 and %d", st2.SharedMisses-st1.SharedMisses, st2.SharedHits-st1.SharedHits, pages)
	}
	if el > time.Second {
		t.Fatalf("%d one-byte hits took %v: charged as if they were read from the node", pages, el)
	}
}

// One tenant reading much of its own export does not flush another tenant's
// cached pages of an imported buffer: a tenant holding no more than its
// share of the cache keeps its copies, the flooder evicts its own.
func TestSharedCacheSharePerTenant(t *testing.T) {
	sys := startWith(t, 256<<20, func(c *mediator.Config) { c.CacheMemory = 8 << 20 })
	a := sys.dial(t, "alpha", 1)
	_, data, sh := exportRandom(t, a, 1<<20, 1, api.ModeImmutable, api.Grant{Tenant: "beta"})
	b := sys.dial(t, "beta", 1)
	q, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := read(t, b, q, 1<<20); err != nil || string(got) != string(data) {
			t.Fatalf("beta reads its import: %v", err)
		}
	}
	st0, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st0.SharedMisses != 16 || st0.SharedHits != 16 {
		t.Fatalf("beta read 16 pages twice: %d misses, %d hits; want 16 and 16", st0.SharedMisses, st0.SharedHits)
	}
	h := sys.dial(t, "hostile", 1)
	hp, _, _ := exportRandom(t, h, 8<<20, 2, api.ModeImmutable)
	for range 2 {
		if _, err := read(t, h, hp, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := read(t, b, q, 1<<20); err != nil || string(got) != string(data) {
		t.Fatalf("beta reads its import again: %v", err)
	}
	st1, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	hst, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("beta after hostile read 8 MiB twice through an 8 MiB cache: misses +%d hits +%d; hostile: %d misses, %d hits",
		st1.SharedMisses-st0.SharedMisses, st1.SharedHits-st0.SharedHits, hst.SharedMisses, hst.SharedHits)
	if st1.SharedMisses != st0.SharedMisses || st1.SharedHits-st0.SharedHits != 16 {
		t.Fatalf("beta lost its cached pages to another tenant's reads: %d misses, %d hits; want 0 and 16",
			st1.SharedMisses-st0.SharedMisses, st1.SharedHits-st0.SharedHits)
	}
}
