package mediator

import (
	"fmt"
	"testing"
	"time"

	"github.com/vgpu/vgpu/client"
)

// BenchmarkRestore: the time from a mediator's start to all its sessions
// rebuilt (New returns once they are), for 1, 100 and 1 000 sessions of 4
// allocations each (one frame) after a crash, against the start of the same mediator
// with none, measured in the same run.
//
//	go test -run xxx -bench Restore -benchtime 1x ./mediator/
func BenchmarkRestore(b *testing.B) {
	for range b.N {
		h := newHostOf(b, 4<<30) // the sim commits memory lazily
		h.start()
		h.stop()
		t0 := time.Now()
		h.start() // nothing to restore: the baseline
		base := time.Since(t0)
		for _, n := range []int{1, 100, 1000} {
			sock := h.serveHost()
			cs := make([]*client.Client, n)
			for i := range cs {
				cs[i] = h.dial(sock)
				for _, size := range []uint64{4 << 10, 64 << 10, 100 << 10, 1 << 20} {
					if _, err := cs[i].Malloc(0, size); err != nil {
						b.Fatal(err)
					}
				}
			}
			h.crash()
			t0 := time.Now()
			h.start()
			took := time.Since(t0)
			if got := len(h.med.restored); got != n {
				b.Fatalf("%d sessions restored, want %d", got, n)
			}
			b.ReportMetric(took.Seconds(), fmt.Sprintf("s/start-%d-sessions", n))
			b.ReportMetric(float64(took)/float64(base), fmt.Sprintf("start-%d/start-0", n))
			b.Logf("%d sessions: start %v (%v a session), empty start %v", n, took, took/time.Duration(n), base)
			for _, c := range cs {
				c.Close()
			}
			h.stop() // ends the restored sessions, freeing their memory
			h.start()

		}
	}
}
