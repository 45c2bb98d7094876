package mediator

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/memory"
)

// A restored oversubscribing session knows which of its frames its node
// sealed: a weight sealed before the mediator's crash, then evicted by
// another buffer's writes after the restart, gives its frames back to the
// node rather than having the buffer's chunks reuse them, which the node
// refuses to write. The journal carries the seal of the frames both as a
// record of its own (replay) and in a compaction's layout.
func TestRestoredSessionKeepsSealedFrames(t *testing.T) {
	const frame = memory.FrameSize
	for _, compact := range []bool{false, true} {
		name := "replay"
		if compact {
			name = "layout"
		}
		t.Run(name, func(t *testing.T) {
			h := newHostOf(t, 64<<20)
			h.startWith(oversubscribed) // 4 frames resident
			c := h.dial(h.serveHost())
			const size = 2 * frame
			weights := pattern(7, size)
			w, err := c.MallocWith(0, size, client.AllocOptions{Hint: api.HintWeight})
			if err != nil {
				t.Fatal(err)
			}
			st := c.Stream()
			st.CopyToDevice(w, weights)
			if err := st.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := c.Seal(w); err != nil {
				t.Fatal(err)
			}
			h.med.mu.Lock()
			ss := h.med.sessions[c.Session()]
			h.med.mu.Unlock()
			if n := ss.space.Stats().SealedFrames; n != 2 {
				t.Fatalf("%d frames of the session sealed after the seal of a 2-frame weight, want 2", n)
			}
			if compact {
				ss.jr.over.Store(true)
				ss.compactJournal()
				if strings.Contains(h.log.String(), "compacting the session's journal failed") {
					t.Fatalf("not compacted:\n%s", h.log.String())
				}
			}

			h.crash()
			out := h.startWith(oversubscribed)
			if !strings.Contains(out, "session restored") {
				t.Fatalf("not restored:\n%s", out)
			}
			h.serveHost()
			h.med.mu.Lock()
			ss = nil
			for _, r := range h.med.restored {
				ss = r
			}
			h.med.mu.Unlock()
			if ss == nil {
				t.Fatal("the session is not among the restored ones")
			}
			if n := ss.space.Stats().SealedFrames; n != 2 {
				t.Errorf("%d frames of the restored session sealed, want 2", n)
			}
			got := make([]byte, size)
			st.CopyFromDevice(got, w) // the client reconnects
			if err := st.Synchronize(); err != nil || !bytes.Equal(got, weights) {
				t.Fatalf("the weight after the restart: %v, bytes equal %v", err, bytes.Equal(got, weights))
			}
			// A buffer as large as the resident cap evicts the weight.
			b, err := c.Malloc(0, 4*frame)
			if err != nil {
				t.Fatal(err)
			}
			st.Memset(b, 5, 4*frame)
			if err := st.Synchronize(); err != nil {
				t.Fatalf("write a buffer that evicts the sealed weight after the restart: %v", err)
			}
			if st := ss.space.Stats(); st.Evictions == 0 {
				t.Fatalf("the buffer evicted nothing: %+v", st)
			}
			st.CopyFromDevice(got, w)
			if err := st.Synchronize(); err != nil || !bytes.Equal(got, weights) {
				t.Fatalf("the weight after the buffer's write: %v, bytes equal %v", err, bytes.Equal(got, weights))
			}
			got = make([]byte, 4*frame)
			st.CopyFromDevice(got, b)
			if err := st.Synchronize(); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{5}, 4*frame)) {
				t.Fatalf("the buffer: %v, bytes equal %v", err, bytes.Equal(got, bytes.Repeat([]byte{5}, 4*frame)))
			}
		})
	}
}
