package mediator_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// The quota file's bandwidth caps the bytes a tenant copies, across all its
// sessions, and the tenant gets it: measured by the bytes its sessions
// copied over the time they took, its rate is at most the cap and at least
// half of it; others keep going at least a quarter of their pace alone
// (in practice all of it); a reload changes the cap; a session that ends
// while its copies wait for bandwidth ends at once.
func TestBandwidthCap(t *testing.T) {
	quota := filepath.Join(t.TempDir(), "q.toml")
	write := func(body string) {
		if err := os.WriteFile(quota, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("[tenants.capped]\nbandwidth = \"8MiB\"\n[tenants.free]\n")
	const rate, burst = 8 << 20, 1 << 20 // burstFor(8 MiB/s) is one chunk
	s := startWith(t, 256<<20, func(c *mediator.Config) { c.Quota = quota; c.TenantBandwidth = 4 << 20 })

	capped1, capped2 := s.dial(t, "capped", 1), s.dial(t, "capped", 1)
	data := randomBytes(3, 4<<20)
	// A tenant without a cap, alone.
	good := s.dial(t, "free", 1)
	victim(t, good) // warm up
	vstart := time.Now()
	for range 5 {
		victim(t, good)
	}
	alone := time.Since(vstart)
	start := time.Now()
	done := make(chan error, 2)
	for _, c := range []*client.Client{capped1, capped2} {
		go func() {
			p, err := c.Malloc(0, uint64(len(data)))
			if err != nil {
				done <- err
				return
			}
			got := make([]byte, len(data))
			c.Stream().CopyToDevice(p, data)
			c.Stream().CopyFromDevice(got, p)
			if err := c.Stream().Synchronize(); err != nil {
				done <- err
				return
			}
			if !bytes.Equal(got, data) {
				t.Error("capped tenant read back different bytes")
			}
			done <- c.Free(p)
		}()
	}
	// meanwhile a tenant without a cap is served at full speed
	vstart = time.Now()
	for range 5 {
		victim(t, good)
	}
	beside := time.Since(vstart)
	t.Logf("uncapped tenant: 10 MiB in %v alone, %v beside the capped one", alone, beside)
	if beside > 4*alone+100*time.Millisecond {
		t.Errorf("uncapped tenant took %v for 10 MiB beside a capped one, %v alone", beside, alone)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	total := 2 * 2 * len(data) // two sessions, in and out
	// Past the first burst, of the cap.
	got := float64(total-burst) / elapsed.Seconds() / rate
	t.Logf("%d MiB copied by one capped tenant's two sessions in %v: %.2f of the cap past its burst", total>>20, elapsed, got)
	if got > 1 || got < 0.5 {
		t.Fatalf("%d bytes at %d B/s (burst %d) took %v: %.2f of the cap, want 0.5 to 1", total, rate, burst, elapsed, got)
	}

	// a tenant the file does not name gets --tenant-bandwidth (4 MiB/s)
	other := s.dial(t, "other", 1)
	p, err := other.Malloc(0, uint64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	other.Stream().CopyToDevice(p, data[:3<<20])
	if err := other.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	got = float64(2<<20) / d.Seconds() / (4 << 20)
	t.Logf("3 MiB at --tenant-bandwidth 4 MiB/s (burst 1 MiB) in %v: %.2f of the cap past its burst", d, got)
	if got > 1.25 || got < 0.5 {
		t.Fatalf("3 MiB at --tenant-bandwidth 4 MiB/s (burst 1 MiB) took %v: %.2f of the cap, want 0.5 to 1.25", d, got)
	}

	// reload: the cap goes, copies go at full speed
	write("[tenants.capped]\n[tenants.free]\n")
	if err := s.med.Reload(); err != nil {
		t.Fatal(err)
	}
	q, err := capped1.Malloc(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for range 4 {
		capped1.Stream().CopyToDevice(q, data)
	}
	if err := capped1.Stream().Synchronize(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("16 MiB after the cap was lifted took %v", d)
	}

	// reload: a tiny cap; the tenant queues far more than it may copy and
	// hangs up: its session ends at once, with its memory freed
	write("[tenants.capped]\nbandwidth = 65536\n[tenants.free]\n")
	if err := s.med.Reload(); err != nil {
		t.Fatal(err)
	}
	small := data[:64<<10]
	r, err := capped2.Malloc(0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for range 2000 { // 125 MiB: half an hour at 64 KiB/s; fills the queue
			capped2.Stream().CopyToDevice(r, small)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	capped1.Close()
	capped2.Close()
	<-sent
	other.Close()
	s.waitIdleExcept(t, 1)
}

// A tenant whose copies wait for bandwidth, and whose session's reader waits
// for them (a free drains the streams), hangs up: the session ends at once.
func TestBandwidthWaitEndsWithSession(t *testing.T) {
	quota := filepath.Join(t.TempDir(), "q.toml")
	if err := os.WriteFile(quota, []byte("[tenants.slow]\nbandwidth = \"64KiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startWith(t, 256<<20, func(c *mediator.Config) { c.Quota = quota })
	good := s.dial(t, "other", 1)
	c := s.dial(t, "slow", 1)
	p, err := c.Malloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(5, 1<<20)
	// The first passes (the burst), then 16 s each. No more than the
	// client's staging slots, or queueing them would wait for the copies.
	for range 6 {
		c.Stream().CopyToDevice(p, data)
	}
	freed := make(chan error, 1)
	go func() { freed <- c.Free(p) }()
	time.Sleep(300 * time.Millisecond)
	victim(t, good)
	start := time.Now()
	c.Close()
	if err := <-freed; err == nil {
		t.Fatal("free answered although its session was closed")
	}
	s.waitIdleExcept(t, 1)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("session took %v to end", d)
	}
	victim(t, good)
}
