package mediator_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/mediator"
)

// A synchronize is answered only after every earlier command of its stream:
// with a memset held up on its way to the node, the synchronize sent after
// it waits for it, however idle the stream looked when it came, and is
// answered after it once the node has it. The session's reader does not
// wait with it.
func TestSynchronizeWaitsForEarlierCommands(t *testing.T) {
	release := make(chan struct{})
	var hold atomic.Bool // the next fill the node is sent waits for release
	sys := startWith(t, 64<<20, func(c *mediator.Config) {
		c.Nodes[0] = proxy(t, c.Nodes[0], func(_ *wire.Conn, _, _ net.Conn, h wire.Header, _ []byte) bool {
			if h.Op == api.OpNodeFill && hold.CompareAndSwap(true, false) {
				<-release
			}
			return false
		})
	})
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let)         // before the mediator's close, which waits for the fill
	r := rawTenant(t, sys) // the SDK synchronizes without OpSynchronize
	body, err := r.Call(api.OpMalloc, nil, api.Encode(&api.Malloc{Size: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	var p api.MallocReply
	if err := api.Decode(body, &p); err != nil {
		t.Fatal(err)
	}
	hold.Store(true)
	memset := r.Go(api.OpMemset, nil, api.Encode(&api.Memset{Stream: api.DefaultStream, Dst: p.Addr, Len: 4096, Value: 7}))
	synchronize := r.Go(api.OpSynchronize, nil, api.Encode(&api.StreamReq{Stream: api.DefaultStream}))
	select {
	case <-synchronize.Done():
		t.Fatalf("synchronize answered (%v) while the memset before it was held up", synchronize.Err)
	case <-memset.Done():
		t.Fatalf("memset answered (%v) while held up", memset.Err)
	case <-time.After(300 * time.Millisecond):
	}
	// Meanwhile the session's reader serves the tenant's other requests.
	kernels := r.Go(api.OpKernels, nil)
	select {
	case <-kernels.Done():
		if kernels.Err != nil {
			t.Fatal(kernels.Err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request after the synchronize not answered while it waits")
	}
	let()
	select {
	case <-synchronize.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("synchronize not answered after the memset was let through")
	}
	select {
	case <-memset.Done():
	default:
		t.Fatal("synchronize answered before the memset before it")
	}
	if memset.Err != nil || synchronize.Err != nil {
		t.Fatalf("memset: %v; synchronize: %v", memset.Err, synchronize.Err)
	}
}
