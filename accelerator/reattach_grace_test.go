package accelerator

import (
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// attachFor attaches the connection with token, asking the node to keep
// its frames at most grace after a drop, and returns its owner id.
func (c *client) attachFor(o uint64, token string, grace time.Duration) (uint64, error) {
	body, err := c.call(api.OpNodeAttach, &api.NodeAttach{Owner: o, Token: token, HasGrace: true, GraceMillis: uint32(grace.Milliseconds())})
	if err != nil {
		return 0, err
	}
	var r api.NodeAttached
	return r.Owner, api.Decode(body, &r)
}

// A connection that attached asking for a grace shorter than the node's
// (a mediator with no journal) is kept that long, not the node's: a
// reclaim within it keeps every frame and states the short grace again,
// so that the reclaimed connection's next drop is kept only that long
// too; a grace of 0 asked is refused, naming it.
func TestReattachAskedGrace(t *testing.T) {
	tn := startNode(t) // the node keeps attached connections DefaultReattachGrace
	const asked = 300 * time.Millisecond
	a := tn.connect(t, "acme")
	_, err := a.attachFor(0, testToken, 0)
	wantErr(t, err, api.ErrInvalidArgument, "grace of 0 ms")
	o, err := a.attachFor(0, testToken, asked)
	if err != nil {
		t.Fatal(err)
	}
	fs := a.alloc(0, 2)
	a.mustWrite(0, []api.Extent{ext(fs[0], 0, 4096)}, pattern(5, 4096))
	a.rpc.Close()
	tn.waitParked(t, o)

	b := tn.connect(t, "acme")
	if _, err := b.attachFor(o, testToken, asked); err != nil {
		t.Fatalf("reclaim within the asked grace: %v", err)
	}
	if got := b.mustRead(0, ext(fs[0], 0, 4096)); string(got) != string(pattern(5, 4096)) {
		t.Fatal("bytes differ after the reclaim")
	}
	b.rpc.Close()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for tn.node.Expired() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the asked grace of %v never ended (the node's is %v)", asked, DefaultReattachGrace)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if held := time.Since(start); held < asked-50*time.Millisecond {
		t.Fatalf("frames released after %v, before the %v grace", held, asked)
	}
	tn.waitUsed(t, [testDevices]uint64{})
	_, err = tn.connect(t, "acme").attachFor(o, testToken, asked)
	wantErr(t, err, api.ErrUnavailable, "keeps nothing")
}
