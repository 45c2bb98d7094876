package wire

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
)

// Call is one request in flight. Done is closed when the reply (or the
// failure of the connection) has arrived; then Err and Body are set.
//
// Its done channel is made only for whoever asks for it (Done, or a Wait
// that must block): a call that completes through its continuation alone,
// as most of the mediator's node calls do, costs no channel (#25).
type Call struct {
	Op   Op
	id   uint64
	Body []byte // the reply body, unless into was given
	Err  error
	into []byte
	// scatter, if set instead of into, are the places the reply body is
	// read into, in order (GoThenScatter).
	scatter [][]byte
	mu      sync.Mutex    // guards done and over
	done    chan struct{} // nil until asked for; closed once over
	over    bool          // the call has completed
	then    func(*Call)   // run once the call completes, by whoever completes it
	rpc     *RPC          // set where waiters read replies (NewRPCCallerReads)
	// Owner is the caller's, for a continuation that finds its object here
	// rather than capture it: a closure would cost an allocation a call.
	Owner any
}

// intoLen is how long a reply read into place must be.
func (c *Call) intoLen() int {
	n := len(c.into)
	for _, p := range c.scatter {
		n += len(p)
	}
	return n
}

// finish runs c's continuation, which may still change Err and Body, and
// then marks c done, so a waiter sees what the continuation did.
func (c *Call) finish() {
	if c.then != nil {
		c.then(c)
	}
	c.mu.Lock()
	c.over = true
	if c.done != nil {
		close(c.done)
	}
	c.mu.Unlock()
}

// closedChan is the Done of every call asked once it has completed.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done is closed once the call has completed. On an RPC of
// NewRPCCallerReads a lone call's reply is read only by Wait (or by the
// helper while other calls are pending): select on Done alone, with no
// Wait, may never see it close.
func (c *Call) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.over {
		return closedChan
	}
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

// Wait blocks until the call completes and returns its error. On an RPC
// of NewRPCCallerReads, a waiter that finds nobody reading reads replies
// itself until its own has come.
func (c *Call) Wait() error {
	r := c.rpc
	if r == nil {
		<-c.Done()
		return c.Err
	}
	for !isDone(c) {
		// Nobody reading: read until the reply has come, without a
		// channel to wait on. Else wait for the reply or the role.
		select {
		case <-r.role:
		default:
			select {
			case <-c.Done():
				return c.Err
			case <-r.role:
			}
		}
		r.readWhile(func() bool { return !isDone(c) })
		r.role <- struct{}{}
	}
	return c.Err
}

func isDone(c *Call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over
}

// RPC issues pipelined requests over one Conn and matches replies to them by
// id. Replies may arrive in any order; the peer decides.
type RPC struct {
	conn *Conn
	name string // the peer, for error messages

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*Call
	err     error // set once the connection has failed
	closed  chan struct{}
	push    func(*RPC, Op, []byte) // notices from the peer (FlagPush); nil: they are a protocol error

	// Where callers read (NewRPCCallerReads): role holds a token while
	// nobody reads; help wakes the helper reader.
	role chan struct{}
	help chan struct{}
}

// NewRPC starts reading replies from conn. name identifies the peer in errors.
func NewRPC(conn *Conn, name string) *RPC { return NewRPCPush(conn, name, nil) }

// NewRPCPush is NewRPC for a peer that may also send notices (FlagPush):
// push gets each, with the RPC, on the goroutine that reads replies, so it
// must be quick and must not wait for a reply on this connection (it may
// send requests).
func NewRPCPush(conn *Conn, name string, push func(*RPC, Op, []byte)) *RPC {
	r := &RPC{conn: conn, name: name, pending: map[uint64]*Call{}, closed: make(chan struct{}), push: push}
	go r.readLoop()
	return r
}

// NewRPCCallerReads is NewRPC for a peer that only answers (no notices),
// where the goroutine that waits for a reply reads it itself. A reader
// goroutine that hands each reply to its waiter costs a thread wake-up per
// call, which is most of a small call's cost on a loaded host. A helper
// goroutine reads instead only while more than one call is in flight, so
// replies nobody waits for yet cannot pile up unread. So a call's Done
// closes once its reply has been read: while more than one call is in
// flight, or while some goroutine is in Wait (Call, CallFD).
func NewRPCCallerReads(conn *Conn, name string) *RPC {
	r := &RPC{conn: conn, name: name, pending: map[uint64]*Call{}, closed: make(chan struct{}),
		role: make(chan struct{}, 1), help: make(chan struct{}, 1)}
	r.role <- struct{}{}
	go r.helpLoop()
	return r
}

// helpLoop reads replies while more than one call is in flight, so that
// one caller's reply waits for nobody's Wait.
func (r *RPC) helpLoop() {
	for {
		select {
		case <-r.help:
		case <-r.closed:
			return
		}
		select {
		case <-r.role:
		case <-r.closed:
			return
		}
		r.readWhile(r.crowded)
		r.role <- struct{}{}
	}
}

// crowded says whether more than one call is in flight.
func (r *RPC) crowded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err == nil && len(r.pending) > 1
}

// readWhile reads frames while more is true, as the holder of the role.
func (r *RPC) readWhile(more func() bool) {
	for more() {
		if err := r.readOne(); err != nil {
			r.fail(err)
			return
		}
	}
}

// Go sends a request whose body is parts and returns without waiting. If into
// is not nil the reply body is read straight into it and must fill it exactly;
// a reply of another length fails the call with ErrProtocol (the connection
// carries on). Once the connection has failed, calls fail at once with the
// error that broke it, which wraps ErrUnavailable or ErrProtocol.
// The caller must not modify parts until the call is done.
func (r *RPC) Go(op Op, into []byte, parts ...[]byte) *Call {
	return r.GoIn(new(Call), op, into, parts...)
}

// GoIn is Go on c, a Call of the caller's that has never been used (the
// zero value, say a field of an object that outlives the call), which
// saves the call an allocation of its own. c must serve no other call.
func (r *RPC) GoIn(c *Call, op Op, into []byte, parts ...[]byte) *Call {
	c.Op, c.into = op, into
	c, ok := r.registerCall(c)
	if ok {
		if err := r.conn.writeFrame(true, op, 0, c.id, parts...); err != nil {
			r.sendFailed(c, err)
		}
	}
	return c
}

// GoThen is Go with a continuation: then runs once the reply has arrived,
// before the call is marked done, on the goroutine that reads replies (or
// on the caller's, if the call fails at once). On an RPC of
// NewRPCCallerReads that may be any goroutine in Wait, whatever locks it
// holds. It must not block for long: replies to every other call wait
// behind it. Unlike Go, it leaves the request in the connection's
// buffer while the connection is held (Hold).
func (r *RPC) GoThen(op Op, into []byte, then func(*Call), parts ...[]byte) *Call {
	return r.GoThenIn(new(Call), op, into, then, parts...)
}

// GoThenIn is GoThen on c, a Call of the caller's that has never been
// used (the zero value, say a field of an object that outlives the call),
// which saves the call an allocation of its own. c must serve no other
// call.
func (r *RPC) GoThenIn(c *Call, op Op, into []byte, then func(*Call), parts ...[]byte) *Call {
	c.Op, c.into, c.then = op, into, then
	c, ok := r.registerCall(c)
	if ok {
		if err := r.conn.WriteFrame(op, 0, c.id, parts...); err != nil {
			r.sendFailed(c, err)
		}
	}
	return c
}

// GoThenScatter is GoThen for a reply whose body is read straight into
// the pieces of into, in order, and must fill them exactly: one request
// for several destinations (the mediator's merged reads).
func (r *RPC) GoThenScatter(op Op, into [][]byte, then func(*Call), parts ...[]byte) *Call {
	c, ok := r.registerCall(&Call{Op: op, scatter: into, then: then})
	if ok {
		if err := r.conn.WriteFrame(op, 0, c.id, parts...); err != nil {
			r.sendFailed(c, err)
		}
	}
	return c
}

// register makes a call pending under a new id and reports true, or
// completes it at once with the error that broke the connection. The
// caller sends the request only on true, and must not read c.Err to tell:
// once pending, the call is the reader's to fail at any moment.
func (r *RPC) register(op Op, into []byte) (*Call, bool) {
	return r.registerThen(op, into, nil)
}

func (r *RPC) registerThen(op Op, into []byte, then func(*Call)) (*Call, bool) {
	return r.registerCall(&Call{Op: op, into: into, then: then})
}

func (r *RPC) registerCall(c *Call) (*Call, bool) {
	if r.role != nil {
		c.rpc = r
	}
	r.mu.Lock()
	if r.err != nil {
		c.Err = r.err
		r.mu.Unlock()
		c.finish()
		return c, false
	}
	r.next++
	c.id = r.next
	r.pending[c.id] = c
	crowded := len(r.pending) > 1
	r.mu.Unlock()
	if crowded && r.help != nil {
		select {
		case r.help <- struct{}{}:
		default: // already woken
		}
	}
	return c, true
}

func (r *RPC) sendFailed(c *Call, err error) {
	if errors.Is(err, vocab.ErrInvalidArgument) { // refused locally, connection intact
		r.complete(c.id, err)
	} else {
		r.fail(fmt.Errorf("send %v to %s: %w", c.Op, r.name, vocab.WithCode(err, vocab.ErrUnavailable)))
	}
}

// Call sends a request and waits for its reply body.
func (r *RPC) Call(op Op, into []byte, parts ...[]byte) ([]byte, error) {
	c := r.Go(op, into, parts...)
	err := c.Wait()
	return c.Body, err
}

// Hold and Release hold the connection's writes (Conn.Hold).
func (r *RPC) Hold()          { r.conn.Hold() }
func (r *RPC) Release() error { return r.conn.Release() }

// Counts returns the bytes of frames sent and received on the connection.
func (r *RPC) Counts() (sent, recv uint64) { return r.conn.Counts() }

// Closed is closed when the connection has failed or been closed.
func (r *RPC) Closed() <-chan struct{} { return r.closed }

// Close closes the connection; calls in flight fail with ErrUnavailable.
func (r *RPC) Close() error {
	r.fail(fmt.Errorf("connection to %s closed: %w", r.name, vocab.ErrUnavailable))
	return nil
}

func (r *RPC) complete(id uint64, err error) *Call {
	r.mu.Lock()
	c := r.pending[id]
	delete(r.pending, id)
	r.mu.Unlock()
	if c != nil && err != nil {
		c.Err = err
		c.finish()
	}
	return c
}

func (r *RPC) fail(err error) {
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return
	}
	r.err = err
	pending := r.pending
	r.pending = map[uint64]*Call{}
	// Closed before anyone can see r.err: a call failed at once with it
	// (registerThen) must find the connection closed, or the client takes
	// a broken connection's error for the mediator's answer and does not
	// reconnect (client/reconnect.go, broken).
	close(r.closed)
	r.mu.Unlock()
	_ = r.conn.Close()
	for _, c := range pending {
		c.Err = err
		c.finish()
	}
}

func (r *RPC) readLoop() {
	for {
		if err := r.readOne(); err != nil {
			r.fail(err)
			return
		}
	}
}

// lost classifies a read failure: errors of ours (a protocol violation) keep
// their code; anything else the connection reports (EOF, EOF mid-frame,
// reset, a body that stalled past BodyTimeout) means the peer is unavailable.
func (r *RPC) lost(err error) error {
	if vocab.CodeOf(err) != vocab.CodeInternal {
		return err
	}
	return fmt.Errorf("connection to %s lost: %w: %w", r.name, err, vocab.ErrUnavailable)
}

func (r *RPC) readOne() error {
	h, err := r.conn.ReadHeader()
	if err != nil {
		return r.lost(err)
	}
	if h.Flags&FlagPush != 0 && r.push != nil {
		body := make([]byte, h.Len)
		if err := r.conn.ReadBody(body); err != nil {
			return r.lost(err)
		}
		r.push(r, h.Op, body)
		return nil
	}
	if h.Flags&FlagReply == 0 {
		return fmt.Errorf("%s sent request %d (%v) where a reply was due: %w", r.name, h.ID, h.Op, vocab.ErrProtocol)
	}
	r.mu.Lock()
	c := r.pending[h.ID]
	delete(r.pending, h.ID)
	r.mu.Unlock()
	if c == nil {
		return fmt.Errorf("%s replied to unknown request %d: %w", r.name, h.ID, vocab.ErrProtocol)
	}
	switch {
	case h.Flags&FlagError != 0:
		body := make([]byte, h.Len)
		if err = r.conn.ReadBody(body); err == nil {
			c.Err = DecodeError(body)
			if re := (*vocab.RemoteError)(nil); !errors.As(c.Err, &re) {
				// A body that is no error: this call fails, and as the
				// frame was well formed, the connection carries on.
				c.Err = fmt.Errorf("%s: error reply to %v (request %d): %w", r.name, h.Op, h.ID, c.Err)
			}
		}
	case c.into != nil || c.scatter != nil:
		if want := c.intoLen(); int(h.Len) != want {
			// The frame is well formed, so skip its body: this call fails,
			// the connection and the other calls on it carry on.
			c.Err = fmt.Errorf("%s replied %d bytes to %v, want %d: %w", r.name, h.Len, h.Op, want, vocab.ErrProtocol)
			err = r.conn.skipBody(int(h.Len))
		} else if c.scatter != nil {
			err = r.conn.readBody(c.scatter...)
		} else {
			err = r.conn.ReadBody(c.into)
		}
	default:
		c.Body = make([]byte, h.Len)
		err = r.conn.ReadBody(c.Body)
	}
	if err != nil {
		err = r.lost(err)
		c.Body = nil
		if c.Err == nil { // else keep the call's own failure
			c.Err = err
		}
	}
	c.finish()
	return err
}
