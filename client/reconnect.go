package client

// Reconnecting. A session's mediator may go away and come back (a crash, a
// kill, an upgrade): one that keeps a journal (--state-dir) rebuilds the
// session with its device memory, and gave the session a token at its
// hello. When the connection breaks, the link dials the socket again and
// resumes the session with that token, for up to Options.Reconnect; calls
// that broke with it are then sent again where that is safe, and
// otherwise fail with ErrInterrupted. docs/architecture.md lists which.
//
// Safe to send again: requests whose effect does not depend on whether
// the first one took effect — reads (a small copy from the device, session
// stats, the kernel catalog) and a stream's batch whose commands only copy
// between the device and memory the program gave (inline bytes, HostAlloc
// memory, a stream's staging buffer) or set memory (memsets), which leave
// the memory as one run would. The restart lost the host regions'
// registrations: the link registers them again with the new mediator,
// under new ids, which it writes into a batch's body each time it sends it
// (fixup). Not safe: allocations, frees, seals, streams made or destroyed,
// launches, device-to-device copies, graphs. Their outcome is unknown: the
// mediator may have applied them before it died. A batch is one unit: one
// unsafe command makes the whole batch fail.
//
// Lock order: a Stream's mu, then link.mu, then Client.mu.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// ErrInterrupted is what a call fails with when the connection to the
// mediator broke while it was in flight and it is not safe to send again:
// the mediator may or may not have applied it. The session goes on, its
// device memory intact. It wraps api.ErrUnavailable.
var ErrInterrupted = fmt.Errorf("interrupted by a lost connection to the mediator; its outcome is unknown: %w", api.ErrUnavailable)

// DefaultReconnect is how long a session tries to reach its mediator again
// after the connection broke (Options.Reconnect).
const DefaultReconnect = time.Minute

// link is a session's connection to its mediator, counting the requests
// sent on it (Requests), and opened again, resuming the session, when it
// breaks.
type link struct {
	requests atomic.Uint64
	socket   string
	hello    api.Hello
	wait     time.Duration // how long to try to reconnect; <0: never
	c        *Client       // its regions are registered again on resume

	mu     sync.Mutex
	rpc    *wire.RPC // guarded by mu
	token  string    // the session's token; "": the mediator keeps none; guarded by mu
	gen    uint64    // connections made so far, less one; guarded by mu
	closed bool      // guarded by mu
}

// current returns the connection and its generation.
func (l *link) current() (*wire.RPC, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rpc, l.gen
}

// Go sends a request on the current connection without waiting.
func (l *link) Go(op wire.Op, into []byte, parts ...[]byte) *wire.Call {
	l.requests.Add(1)
	rpc, _ := l.current()
	return rpc.Go(op, into, parts...)
}

// Call sends a request and waits for its reply. If the connection breaks
// meanwhile, it reconnects and sends the request again where op is safe
// to repeat (retriable), and otherwise fails with ErrInterrupted.
func (l *link) Call(op wire.Op, into []byte, parts ...[]byte) ([]byte, error) {
	return l.call(op, func(rpc *wire.RPC) ([]byte, error) { return rpc.Call(op, into, parts...) })
}

// CallFD is Call passing fd along; it is never sent again.
func (l *link) CallFD(op wire.Op, fd int, parts ...[]byte) ([]byte, error) {
	return l.call(op, func(rpc *wire.RPC) ([]byte, error) { return rpc.CallFD(op, fd, parts...) })
}

// A repeat may break too (the mediator died again before answering it):
// it is repeated on the next connection, for as long as connections are
// made.
func (l *link) call(op wire.Op, do func(*wire.RPC) ([]byte, error)) ([]byte, error) {
	l.requests.Add(1)
	rpc, gen := l.ready()
	for {
		body, err := do(rpc)
		if err == nil || !broken(rpc, err) {
			return body, err
		}
		if rerr := l.reconnect(gen); rerr != nil {
			return nil, rerr
		}
		if !retriable(op) {
			return nil, fmt.Errorf("%v: %w", op, ErrInterrupted)
		}
		l.requests.Add(1)
		rpc, gen = l.current()
	}
}

// retriable says whether a request of op may be sent again after the
// connection broke while it was in flight (see the file's comment).
func retriable(op wire.Op) bool {
	switch op {
	case api.OpKernels, api.OpSessionStats, api.OpCopyFromDevice, api.OpStatus:
		return true
	}
	return false
}

// broken says whether err, the failure of a call on rpc, is rpc's
// connection breaking rather than the mediator's answer.
func broken(rpc *wire.RPC, err error) bool {
	var re *api.RemoteError
	if errors.As(err, &re) {
		return false
	}
	select {
	case <-rpc.Closed():
		return true
	default:
		return false
	}
}

// reconnect replaces the connection of generation gen, broken, by a new
// one that resumes the session, unless another caller did already. It
// tries for l.wait, and fails with api.ErrUnavailable when the session
// cannot be resumed: no token, the mediator did not come back in time, or
// it came back without the session.
func (l *link) reconnect(gen uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.gen != gen:
		return nil // reconnected by another call
	case l.closed:
		return fmt.Errorf("session closed: %w", api.ErrUnavailable)
	case l.token == "" || l.wait < 0:
		return fmt.Errorf("connection to the mediator at %s lost, and the session cannot be resumed (the mediator keeps no journal, or reconnecting is off): %w", l.socket, api.ErrUnavailable)
	}
	hello := l.hello
	hello.Resume = l.token
	deadline := time.Now().Add(l.wait)
	pause := 20 * time.Millisecond
	for {
		rpc, reply, err := dial(l.socket, hello, 10*time.Second)
		if err == nil {
			if err := l.c.reregister(rpc); err != nil {
				rpc.Close()
				return err
			}
			l.rpc, l.gen = rpc, l.gen+1
			if reply.Token != "" {
				l.token = reply.Token
			}
			return nil
		}
		var re *api.RemoteError
		if errors.As(err, &re) {
			return fmt.Errorf("resuming the session: %w", err) // the mediator is back without it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mediator at %s not back within %v: %w", l.socket, l.wait, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Second)
	}
}

// send sends request f on the connection, reconnecting first if it is
// known to be broken, with the ids its host regions have there.
func (l *link) send(f *inflight) {
	rpc, gen := l.ready()
	l.requests.Add(1)
	l.c.fix(f)
	f.rpc, f.sentOn = rpc, gen
	if f.call == nil {
		f.call = rpc.GoIn(&f.callRoom, f.op, f.into, f.parts...)
		return
	}
	f.call = rpc.Go(f.op, f.into, f.parts...)
}

// ready returns the connection and its generation, reconnecting first
// if it is known to be broken: a request not sent yet is safe to send on
// the new one, whatever it does. A failed reconnect leaves the broken
// connection, on which calls fail with the error that broke it.
func (l *link) ready() (*wire.RPC, uint64) {
	rpc, gen := l.current()
	select {
	case <-rpc.Closed():
		if l.reconnect(gen) == nil {
			return l.current()
		}
	default:
	}
	return rpc, gen
}

// fix writes the ids its host regions have now into f's body.
func (c *Client) fix(f *inflight) {
	if len(f.fixups) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range f.fixups {
		binary.LittleEndian.PutUint32(f.body[x.at:], x.r.id)
	}
}

// resend deals with request f, whose connection broke while it was in
// flight: once reconnected, it sends f again if that is safe and returns
// the outcome, or fails with ErrInterrupted. A repeat whose connection
// breaks in turn is sent again on the next one, as in call.
func (l *link) resend(f *inflight) error {
	for {
		if err := l.reconnect(f.sentOn); err != nil {
			return err
		}
		if f.unsafe {
			return ErrInterrupted
		}
		l.send(f)
		if err := f.call.Wait(); err == nil || !broken(f.rpc, err) {
			return err
		}
	}
}

// Close closes the connection for good.
func (l *link) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.rpc.Close()
}

// reregister registers the client's host regions with a mediator that
// resumed the session on rpc, which forgot them: each gets a new id.
// Requests encoded with the old ids are never sent on rpc (Stream.flush).
// The caller holds l.mu.
func (c *Client) reregister(rpc *wire.RPC) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		// The old memfd cannot be mapped writable again (the mediator
		// sealed it: mediator/hostmem.go): the region moves, bytes and
		// address kept, onto a new one.
		fd, err := remap(r.mem)
		if err == nil {
			var body []byte
			body, err = rpc.CallFD(api.OpHostRegister, fd, api.Encode(&api.HostRegister{Size: uint64(len(r.mem))}))
			unix.Close(fd)
			var reply api.HostRegion
			if err == nil {
				err = api.Decode(body, &reply)
			}
			r.id = reply.Region
		}
		if err != nil {
			return fmt.Errorf("registering %d bytes of host memory again with the resumed session: %w", len(r.mem), err)
		}
	}
	return nil
}
