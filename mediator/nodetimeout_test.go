package mediator

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/internal/pki"
)

// A node that is busy for longer than the node timeout is not cut off: it
// answers a call only 2.5 bounds after reading it, or reads nothing for as
// long while a burst of writes closes its receive window. Its kernel
// acknowledges the data and answers the probes all along, so its host is
// not silent, and every call succeeds. (A silent host is the root test
// e2e/root TestNetlabNodeTimeout's.)
func TestBusyNodeIsNotCutOff(t *testing.T) {
	const bound = wire.MinPeerTimeout
	const busy = bound * 5 / 2
	for _, tc := range []struct {
		name  string
		tls   bool
		burst int // 1 MiB writes sent while the node is busy
	}{
		{"slow reply", false, 1},
		// More than the two sockets' buffers hold: the window closes.
		{"closed window over TLS", true, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var nodeCfg, medCfg *tls.Config
			if tc.tls {
				var err error
				if nodeCfg, medCfg, err = pki.Ephemeral("127.0.0.1"); err != nil {
					t.Fatal(err)
				}
			}
			addr, served := busyNode(t, nodeCfg, busy, tc.burst)
			rpc, _, err := dialNode(addr, nodeTenant{name: "t", timeout: bound}, medCfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rpc.Close()

			payload := make([]byte, wire.MaxChunk)
			start := time.Now()
			calls := make(chan *wire.Call, tc.burst)
			sent := make(chan time.Duration, 1)
			go func() {
				for range tc.burst {
					calls <- rpc.Go(api.OpNodeWrite, nil, payload) // blocks while the window is closed
				}
				sent <- time.Since(start)
			}()
			for i := range tc.burst {
				select {
				case c := <-calls:
					select {
					case <-c.Done():
					case <-time.After(busy + 20*time.Second):
						t.Fatalf("call %d of %d: no answer after %v", i+1, tc.burst, time.Since(start))
					}
					if c.Err != nil {
						t.Fatalf("call %d of %d to a node busy for %v (node timeout %v), after %v: %v",
							i+1, tc.burst, busy, bound, time.Since(start), c.Err)
					}
				case <-time.After(busy + 20*time.Second):
					t.Fatalf("call %d of %d not sent after %v", i+1, tc.burst, time.Since(start))
				}
			}
			took, sendTook := time.Since(start), <-sent
			if took < busy {
				t.Fatalf("answered after %v: the node was not busy for %v", took, busy)
			}
			if tc.burst > 1 && sendTook < bound {
				t.Fatalf("the burst was sent within %v: the window did not stay closed past the %v bound", sendTook, bound)
			}
			if err := <-served; err != nil {
				t.Fatalf("node: %v", err)
			}
			t.Logf("answered after %v; the burst took %v to send", took, sendTook)
		})
	}
}

// busyNode serves one mediator connection on loopback: it answers the
// hello, then is busy for busy before it answers calls requests. With one
// call it reads it first, as a node that runs a long kernel; with more it
// reads nothing until then, as a node whose queue is full. served gets
// how serving ended.
func busyNode(t *testing.T, cfg *tls.Config, busy time.Duration, calls int) (addr string, served <-chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if cfg != nil {
		l = tls.NewListener(l, cfg)
	}
	done := make(chan error, 1)
	go func() { done <- serveBusy(l, busy, calls) }()
	return l.Addr().String(), done
}

func serveBusy(l net.Listener, busy time.Duration, calls int) error {
	nc, err := l.Accept()
	if err != nil {
		return err
	}
	defer nc.Close()
	c := wire.NewConn(nc)
	read := func() (wire.Header, error) {
		h, err := c.ReadHeader()
		if err == nil {
			_, err = io.Copy(io.Discard, c.BodyReader(int(h.Len)))
		}
		return h, err
	}
	h, err := read()
	if err != nil || h.Op != api.OpHello {
		return errors.Join(err, errors.New("no hello"))
	}
	if err := c.Reply(h, api.Encode(&api.HelloReply{Version: api.Version, Session: 1})); err != nil {
		return err
	}
	var first []wire.Header
	if calls == 1 {
		if h, err = read(); err != nil {
			return err
		}
		first = append(first, h)
	}
	time.Sleep(busy)
	for _, h := range first {
		if err := c.Reply(h); err != nil {
			return err
		}
	}
	for range calls - len(first) {
		if h, err = read(); err != nil {
			return err
		}
		if err := c.Reply(h); err != nil {
			return err
		}
	}
	return nil
}

func TestNodeTimeoutConfig(t *testing.T) {
	_, err := New(Config{Nodes: []string{"127.0.0.1:1"}, NodeTimeout: 1500 * time.Millisecond})
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "1.5s") {
		t.Fatalf("New with a 1.5s node timeout: %v, want ErrInvalidArgument naming 1.5s", err)
	}
}
