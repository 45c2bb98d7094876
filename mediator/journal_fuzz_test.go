package mediator

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/memory"
)

// FuzzJournalRead reads arbitrary bytes as a session's journal file, as a
// restarting mediator reads what a crash, a full disk or a hostile hand
// left in its state directory. Reading never panics and never takes a
// session for another: what it accepts has a header of the file's session,
// and writing back what it read gives a file that reads the same.
func FuzzJournalRead(f *testing.F) {
	hdr, err := record(sessionRecord{ID: 7, Tenant: "team-a", Namespace: "moby", Container: "c1", TokenHash: tokenHash("t"),
		Devices: []journalDevice{{Node: "127.0.0.1:7000", Index: 1}},
		Conns:   []journalConn{{Node: "127.0.0.1:7000", Owner: 3, Token: strings.Repeat("ab", 16)}}})
	if err != nil {
		f.Fatal(err)
	}
	seed := hdr
	for _, op := range []journalOp{
		{Op: opAlloc, Dev: 0, Size: 3 << 20, Hint: 1, VA: 1 << 40, Grants: [][]uint64{{0, 2 << 20}}},
		{Op: opSeal, VA: 1 << 40}, {Op: opFrames, VA: 1 << 40, Size: 2 << 20}, {Op: opCredit, VA: 1 << 40, Credit: 1 << 20},
		{Op: opStream, Stream: 2}, {Op: opWith, VA: 1 << 40, Stream: 2}, {Op: opUnstream, Stream: 2}, {Op: opFree, VA: 1 << 40},
		{Op: opGraph, Graph: 1, Body: []byte{2, 0, 0, 0, 0, 0, 0, 0}}, {Op: opGraph, Graph: 2}, {Op: opUngraph, Graph: 1},
		{Op: opTGraph, Graph: 1, Body: []byte("def"), VA: 1 << 40}, {Op: opUntgraph, Graph: 1},
		{Op: opLayout, Layout: &memory.Layout{
			Chunks: []memory.ChunkLayout{{VA: 1 << 32, Resident: true, Frame: 2 << 20, FrameSealed: true}, {VA: 1<<32 + 2<<20, Hint: 3, Key: 4, Sum: 0xabcd}},
			Allocs: []memory.AllocLayout{{VA: 1 << 32, Size: 3 << 20, Sealed: true}},
		}},
	} {
		b, err := record(op)
		if err != nil {
			f.Fatal(err)
		}
		seed = append(seed, b...)
	}
	f.Add(seed)
	f.Add(hdr[:len(hdr)-1])
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}) // a record of 4 GiB in 8 bytes
	j := &journal{dir: f.TempDir()}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(j.path(7), data, 0o600); err != nil {
			t.Fatal(err)
		}
		got := j.read("7.journal")
		if got.id != 7 {
			t.Fatalf("7.journal read as session %d", got.id)
		}
		if got.err != nil {
			return
		}
		if got.rec.ID != 7 {
			t.Fatalf("7.journal accepted with the header of session %d", got.rec.ID)
		}
		again, err := record(got.rec)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range got.ops {
			b, err := record(op)
			if err != nil {
				t.Fatal(err)
			}
			again = append(again, b...)
		}
		if err := os.WriteFile(j.path(7), again, 0o600); err != nil {
			t.Fatal(err)
		}
		back := j.read("7.journal")
		if back.err != nil || !reflect.DeepEqual(back.rec, got.rec) || !reflect.DeepEqual(back.ops, got.ops) {
			t.Fatalf("what was read, written back, reads as %+v %+v (%v), not %+v %+v", back.rec, back.ops, back.err, got.rec, got.ops)
		}
	})
}
