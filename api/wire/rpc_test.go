package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
	"pgregory.net/rapid"
)

// testBodyTimeout replaces BodyTimeout for the whole test binary. It is set
// once, in TestMain, before any connection exists: BodyTimeout is read
// without synchronisation, so setting it inside a test would race with the
// reader goroutines of earlier tests.
const testBodyTimeout = time.Second

func TestMain(m *testing.M) {
	BodyTimeout = testBodyTimeout
	os.Exit(m.Run())
}

// serve listens on loopback TCP and runs handler on the first connection,
// closing it when handler returns. The test's cleanup waits for handler.
func serve(t testing.TB, handler func(c *Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		ln.Close()
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		c := NewConn(nc)
		defer c.Close()
		handler(c)
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("test server did not finish")
		}
	})
	return ln.Addr().String()
}

// A dialer connects an RPC to addr; the test's cleanup closes it (before
// the server's cleanup waits, since cleanups run last-in first-out).
type dialer func(t testing.TB, addr string) *RPC

func dialWith(newRPC func(*Conn, string) *RPC) dialer {
	return func(t testing.TB, addr string) *RPC {
		t.Helper()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		r := newRPC(NewConn(nc), "test-server")
		t.Cleanup(func() { r.Close() })
		return r
	}
}

// dial connects an RPC whose reader goroutine reads every reply.
var dial = dialWith(NewRPC)

// rpcModes are the two ways an RPC reads replies.
var rpcModes = []struct {
	name string
	dial dialer
}{{"reader", dial}, {"caller-reads", dialWith(NewRPCCallerReads)}}

// TestRPC runs the RPC's tests for both ways of reading replies.
func TestRPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, dialer)
	}{
		{"PipelineReverse", testRPCPipelineReverse}, {"Concurrent", testRPCConcurrent}, {"Into", testRPCInto},
		{"IntoWrongLength", testRPCIntoWrongLength}, {"ReplyTooLarge", testRPCReplyTooLarge},
		{"RequestTooLarge", testRPCRequestTooLarge}, {"PeerGone", testRPCPeerGone}, {"Close", testRPCClose},
		{"ErrorReply", testRPCErrorReply}, {"ProtocolViolations", testRPCProtocolViolations},
		{"BodyTimeout", testRPCBodyTimeout}, {"IntoSkipStalls", testRPCIntoSkipStalls},
	} {
		for _, m := range rpcModes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) { tc.test(t, m.dial) })
		}
	}
}

// dialRaw connects a plain TCP connection to addr.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// readFrame reads one whole frame.
func readFrame(c *Conn) (Header, []byte, error) {
	h, err := c.ReadHeader()
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.Len)
	return h, body, c.ReadBody(body)
}

// rawHeader is a frame header as bytes, for peers that misbehave.
func rawHeader(n uint32, op Op, flags uint16, id uint64) []byte {
	b := make([]byte, HeaderSize)
	binary.LittleEndian.PutUint32(b[0:], n)
	binary.LittleEndian.PutUint16(b[4:], uint16(op))
	binary.LittleEndian.PutUint16(b[6:], flags)
	binary.LittleEndian.PutUint64(b[8:], id)
	return b
}

// waitCall waits for c with a bound, so a lost reply fails the test rather
// than hanging it.
func waitCall(t *testing.T, c *Call) error {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- c.Wait() }()
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("call %v never completed", c.Op)
		return nil
	}
}

// echo answers every request with its own body until the connection ends.
func echo(c *Conn) {
	for {
		h, body, err := readFrame(c)
		if err != nil {
			return
		}
		if err := c.Reply(h, body); err != nil {
			return
		}
	}
}

// testRPCPipelineReverse: 1000 requests go out before any reply; the server
// reads them all, then answers last first; every call gets its own reply.
func testRPCPipelineReverse(t *testing.T, dial dialer) {
	const n = 1000
	addr := serve(t, func(c *Conn) {
		type req struct {
			h    Header
			body []byte
		}
		var reqs []req
		seen := map[uint64]bool{}
		for len(reqs) < n {
			h, body, err := readFrame(c)
			if err != nil {
				t.Errorf("server read request %d: %v", len(reqs), err)
				return
			}
			if h.Flags != 0 || seen[h.ID] {
				t.Errorf("request %d: flags %#x, id %d (seen: %v)", len(reqs), h.Flags, h.ID, seen[h.ID])
			}
			seen[h.ID] = true
			reqs = append(reqs, req{h, body})
		}
		for i := n - 1; i >= 0; i-- {
			if err := c.Reply(reqs[i].h, []byte("reply to "), reqs[i].body); err != nil {
				t.Errorf("server reply %d: %v", i, err)
				return
			}
		}
		io.Copy(io.Discard, c.NetConn())
	})
	r := dial(t, addr)
	calls := make([]*Call, n)
	for i := range calls {
		calls[i] = r.Go(opMalloc, nil, []byte(fmt.Sprintf("request %d", i)))
	}
	for i, c := range calls {
		if err := waitCall(t, c); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if want := fmt.Sprintf("reply to request %d", i); string(c.Body) != want {
			t.Fatalf("call %d got %q, want %q", i, c.Body, want)
		}
		if c.Op != opMalloc {
			t.Fatalf("call %d: op %v", i, c.Op)
		}
	}
}

// testRPCConcurrent: many goroutines share one RPC.
func testRPCConcurrent(t *testing.T, dial dialer) {
	r := dial(t, serve(t, echo))
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				msg := []byte(fmt.Sprintf("g%d-%d", g, i))
				body, err := r.Call(opFree, nil, msg[:2], msg[2:])
				if err != nil || !bytes.Equal(body, msg) {
					t.Errorf("g%d call %d: %q, %v", g, i, body, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// testRPCInto: a reply is read straight into the caller's buffer.
func testRPCInto(t *testing.T, dial dialer) {
	r := dial(t, serve(t, echo))
	for _, n := range []int{0, 1, 4096, MaxChunk, MaxBody} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i * 31)
		}
		into := make([]byte, n)
		c := r.Go(opCopyFromDevice, into, payload)
		if err := waitCall(t, c); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(into, payload) {
			t.Fatalf("%d bytes: into holds other bytes", n)
		}
		if c.Body != nil {
			t.Fatalf("%d bytes: Body set (%d bytes) although into was given", n, len(c.Body))
		}
	}
}

// testRPCIntoWrongLength: a reply longer or shorter than into fails that call
// with ErrProtocol; the frame is skipped, so the connection carries on.
func testRPCIntoWrongLength(t *testing.T, dial dialer) {
	// The server answers each request with as many bytes as its body says.
	addr := serve(t, func(c *Conn) {
		for {
			h, body, err := readFrame(c)
			if err != nil {
				return
			}
			n := binary.LittleEndian.Uint32(body)
			if err := c.Reply(h, bytes.Repeat([]byte{0xab}, int(n))); err != nil {
				return
			}
		}
	})
	r := dial(t, addr)
	ask := func(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }
	for _, tc := range []struct{ into, reply int }{{100, 101}, {100, 99}, {100, 0}, {0, 1}, {10, MaxBody}} {
		into := make([]byte, tc.into)
		err := waitCall(t, r.Go(opCopyFromDevice, into, ask(uint32(tc.reply))))
		if !errors.Is(err, vocab.ErrProtocol) {
			t.Errorf("into %d, reply %d: %v, want ErrProtocol", tc.into, tc.reply, err)
		} else if !strings.Contains(err.Error(), fmt.Sprint(tc.reply)) || !strings.Contains(err.Error(), "test-server") {
			t.Errorf("into %d, reply %d: message %q names neither the length nor the peer", tc.into, tc.reply, err)
		}
		// The connection is still in step: a right-sized call works.
		into = make([]byte, 7)
		if err := waitCall(t, r.Go(opCopyFromDevice, into, ask(7))); err != nil || !bytes.Equal(into, bytes.Repeat([]byte{0xab}, 7)) {
			t.Fatalf("after a wrong-length reply: %x, %v", into, err)
		}
	}
	select {
	case <-r.Closed():
		t.Fatal("RPC closed after wrong-length replies")
	default:
	}
}

// TestReadHeaderTooLarge: a header announcing more than MaxBody is refused.
func TestReadHeaderTooLarge(t *testing.T) {
	got := make(chan error, 1)
	addr := serve(t, func(c *Conn) {
		h, err := c.ReadHeader() // exactly MaxBody: fine
		if err != nil || h.Len != MaxBody || h.ID != 1 {
			t.Errorf("header of MaxBody: %+v, %v", h, err)
		}
		if err := c.ReadBody(make([]byte, h.Len)); err != nil {
			t.Errorf("body of MaxBody: %v", err)
		}
		h, err = c.ReadHeader()
		if h.Len != MaxBody+1 || h.ID != 2 || h.Op != opNodeWrite {
			t.Errorf("refused header reads as %+v", h)
		}
		got <- err
	})
	nc := dialRaw(t, addr)
	frame := append(rawHeader(MaxBody, opNodeWrite, 0, 1), make([]byte, MaxBody)...)
	frame = append(frame, rawHeader(MaxBody+1, opNodeWrite, 0, 2)...)
	if _, err := nc.Write(frame); err != nil {
		t.Fatal(err)
	}
	err := <-got
	if !errors.Is(err, vocab.ErrProtocol) || !strings.Contains(err.Error(), fmt.Sprint(MaxBody+1)) {
		t.Fatalf("ReadHeader of MaxBody+1: %v, want ErrProtocol naming the length", err)
	}
	for _, n := range []uint32{MaxBody + 1, 1 << 31, 0xffffffff} {
		a, b := net.Pipe()
		go func() { a.Write(rawHeader(n, opHello, 0, 9)); a.Close() }()
		if _, err := NewConn(b).ReadHeader(); !errors.Is(err, vocab.ErrProtocol) {
			t.Errorf("header of %d bytes: %v, want ErrProtocol", n, err)
		}
		b.Close()
	}
}

// testRPCReplyTooLarge: a reply header over MaxBody fails the calls with
// ErrProtocol and drops the connection, which cannot resync.
func testRPCReplyTooLarge(t *testing.T, dial dialer) {
	addr := serve(t, func(c *Conn) {
		h, _, err := readFrame(c)
		if err != nil {
			return
		}
		c.NetConn().Write(rawHeader(MaxBody+1, h.Op, FlagReply, h.ID))
		io.Copy(io.Discard, c.NetConn())
	})
	r := dial(t, addr)
	c1 := r.Go(opNodeRead, nil, []byte("x"))
	if err := waitCall(t, c1); !errors.Is(err, vocab.ErrProtocol) {
		t.Fatalf("call answered with an oversized header: %v, want ErrProtocol", err)
	}
	<-r.Closed()
}

// TestWriteFrameTooLarge: WriteFrame refuses a body over MaxBody without
// writing anything, so the connection stays usable.
func TestWriteFrameTooLarge(t *testing.T) {
	frames := make(chan Header, 4)
	addr := serve(t, func(c *Conn) {
		for {
			h, _, err := readFrame(c)
			if err != nil {
				close(frames)
				return
			}
			frames <- h
		}
	})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc)
	half := make([]byte, MaxBody/2+1)
	err = c.WriteFrame(opNodeWrite, 0, 1, half, half)
	if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(2*len(half))) {
		t.Fatalf("WriteFrame of %d bytes: %v, want ErrInvalidArgument naming the size", 2*len(half), err)
	}
	if err := c.WriteFrame(opNodeWrite, 0, 2, make([]byte, MaxBody)); err != nil {
		t.Fatalf("WriteFrame of MaxBody after a refusal: %v", err)
	}
	if err := c.WriteFrame(opNodeFill, 0, 3); err != nil {
		t.Fatalf("WriteFrame of no body: %v", err)
	}
	c.Close()
	var got []Header
	for h := range frames {
		got = append(got, h)
	}
	want := []Header{{Len: MaxBody, Op: opNodeWrite, ID: 2}, {Len: 0, Op: opNodeFill, ID: 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("server saw %+v, want %+v", got, want)
	}
}

// testRPCRequestTooLarge: an oversized request fails alone, at once.
func testRPCRequestTooLarge(t *testing.T, dial dialer) {
	r := dial(t, serve(t, echo))
	c := r.Go(opCopyToDevice, nil, make([]byte, MaxBody), []byte{1})
	select {
	case <-c.Done():
	default:
		t.Fatal("oversized request still pending after Go returned")
	}
	if !errors.Is(c.Err, vocab.ErrInvalidArgument) {
		t.Fatalf("oversized request: %v, want ErrInvalidArgument", c.Err)
	}
	if body, err := r.Call(opFree, nil, []byte("still here")); err != nil || string(body) != "still here" {
		t.Fatalf("call after a refused one: %q, %v", body, err)
	}
}

// testRPCPeerGone: however the server goes away — a clean close, a reset,
// mid-header or mid-body — every pending call fails with ErrUnavailable and
// later calls fail at once.
func testRPCPeerGone(t *testing.T, dial dialer) {
	const pending = 10
	for name, leave := range map[string]func(c *Conn, last Header){
		"close": func(c *Conn, _ Header) {},
		"reset": func(c *Conn, _ Header) {
			c.NetConn().(*net.TCPConn).SetLinger(0)
		},
		"mid-header": func(c *Conn, last Header) {
			c.NetConn().Write(rawHeader(8, last.Op, FlagReply, last.ID)[:9])
		},
		"mid-body": func(c *Conn, last Header) {
			c.NetConn().Write(append(rawHeader(8, last.Op, FlagReply, last.ID), 1, 2, 3))
		},
		"mid-error-body": func(c *Conn, last Header) {
			c.NetConn().Write(append(rawHeader(8, last.Op, FlagReply|FlagError, last.ID), 1, 2, 3))
		},
	} {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, func(c *Conn) {
				var last Header
				for i := 0; i < pending; i++ {
					h, _, err := readFrame(c)
					if err != nil {
						t.Errorf("server read %d: %v", i, err)
						return
					}
					last = h
				}
				leave(c, last)
			})
			r := dial(t, addr)
			var calls []*Call
			for i := 0; i < pending; i++ {
				into := []byte(nil)
				if i%2 == 1 {
					into = make([]byte, 8)
				}
				calls = append(calls, r.Go(opNodeRead, into, []byte{byte(i)}))
			}
			for i, c := range calls {
				err := waitCall(t, c)
				if !errors.Is(err, vocab.ErrUnavailable) || vocab.CodeOf(err) != vocab.CodeUnavailable {
					t.Errorf("pending call %d: %v (code %v), want ErrUnavailable", i, err, vocab.CodeOf(err))
				} else if !strings.Contains(err.Error(), "test-server") {
					t.Errorf("pending call %d: %q does not name the peer", i, err)
				}
			}
			select {
			case <-r.Closed():
			case <-time.After(5 * time.Second):
				t.Fatal("Closed not closed after the peer left")
			}
			c := r.Go(opFree, nil, []byte("late"))
			select {
			case <-c.Done():
			default:
				t.Fatal("a call after failure did not fail at once")
			}
			if !errors.Is(c.Err, vocab.ErrUnavailable) {
				t.Fatalf("call after failure: %v, want ErrUnavailable", c.Err)
			}
		})
	}
}

// testRPCClose: closing the RPC fails what is pending and what comes later.
func testRPCClose(t *testing.T, dial dialer) {
	addr := serve(t, func(c *Conn) { io.Copy(io.Discard, c.NetConn()) })
	r := dial(t, addr)
	c := r.Go(opSynchronize, nil, []byte{3, 0, 0, 0})
	r.Close()
	if err := waitCall(t, c); !errors.Is(err, vocab.ErrUnavailable) {
		t.Fatalf("pending call after Close: %v", err)
	}
	if _, err := r.Call(opFree, nil); !errors.Is(err, vocab.ErrUnavailable) {
		t.Fatalf("call after Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// testRPCErrorReply: an error reply carries its code and message to the
// caller; the calls around it are unaffected.
func testRPCErrorReply(t *testing.T, dial dialer) {
	failure := fmt.Errorf("malloc of %d bytes on device %d: %w", uint64(1)<<40, 3, vocab.ErrOutOfMemory)
	addr := serve(t, func(c *Conn) {
		for {
			h, body, err := readFrame(c)
			if err != nil {
				return
			}
			if string(body) == "fail" {
				err = c.ReplyError(h, failure)
			} else {
				err = c.Reply(h, body)
			}
			if err != nil {
				return
			}
		}
	})
	r := dial(t, addr)
	before := r.Go(opFree, nil, []byte("ok1"))
	into := make([]byte, 4)
	bad := r.Go(opMalloc, into, []byte("fail"))
	after := r.Go(opFree, nil, []byte("ok2"))
	err := waitCall(t, bad)
	var re *vocab.RemoteError
	if !errors.As(err, &re) || re.Code != vocab.CodeOutOfMemory || re.Msg != failure.Error() {
		t.Fatalf("error reply: %#v, want RemoteError{OutOfMemory, %q}", err, failure)
	}
	if !errors.Is(fmt.Errorf("tenant: %w", err), vocab.ErrOutOfMemory) {
		t.Fatal("error reply is not ErrOutOfMemory once wrapped")
	}
	if bad.Body != nil || !bytes.Equal(into, make([]byte, 4)) {
		t.Fatalf("an error reply wrote a body: %q, into %x", bad.Body, into)
	}
	for _, c := range []*Call{before, after} {
		if err := waitCall(t, c); err != nil {
			t.Fatalf("call around the error: %v", err)
		}
	}
}

// testRPCProtocolViolations: a request where a reply is due, or a reply to
// no request, is a protocol error that drops the connection; an error reply
// whose body is no error fails its call alone, naming it.
func testRPCProtocolViolations(t *testing.T, dial dialer) {
	for name, tc := range map[string]struct {
		answer func(c *Conn, h Header)
		drops  bool
	}{
		"request instead of reply": {func(c *Conn, h Header) { c.WriteFrame(h.Op, 0, h.ID) }, true},
		"reply to unknown id":      {func(c *Conn, h Header) { c.WriteFrame(h.Op, FlagReply, h.ID+1000) }, true},
		"bad error body":           {func(c *Conn, h Header) { c.WriteFrame(h.Op, FlagReply|FlagError, h.ID, []byte{1}) }, false},
	} {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, func(c *Conn) {
				h, _, err := readFrame(c)
				if err != nil {
					return
				}
				tc.answer(c, h)
				echo(c)
			})
			r := dial(t, addr)
			c := r.Go(opStatus, nil)
			if err := waitCall(t, c); !errors.Is(err, vocab.ErrProtocol) {
				t.Fatalf("%s: %v, want ErrProtocol", name, err)
			} else if !tc.drops && !strings.Contains(err.Error(), fmt.Sprintf("%v (request %d)", opStatus, c.id)) {
				t.Fatalf("%s: %v, want the op and request named", name, err)
			}
			if tc.drops {
				select {
				case <-r.Closed():
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: the connection stayed open", name)
				}
				return
			}
			if body, err := r.Call(opFree, nil, []byte("next")); err != nil || string(body) != "next" {
				t.Fatalf("%s: the next call: %q, %v", name, body, err)
			}
		})
	}
}

// TestBodyTimeout: a peer that sends a header and half a body, then stalls,
// is dropped once BodyTimeout has passed.
func TestBodyTimeout(t *testing.T) {
	type result struct {
		err     error
		elapsed time.Duration
	}
	got := make(chan result, 1)
	addr := serve(t, func(c *Conn) {
		h, err := c.ReadHeader()
		if err != nil {
			t.Errorf("ReadHeader: %v", err)
			return
		}
		start := time.Now()
		err = c.ReadBody(make([]byte, h.Len))
		got <- result{err, time.Since(start)}
		// Returning closes the connection: the peer is dropped.
	})
	nc := dialRaw(t, addr)
	if _, err := nc.Write(append(rawHeader(1000, opNodeWrite, 0, 1), make([]byte, 500)...)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := <-got
	if !errors.Is(res.err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled body: %v, want a deadline error", res.err)
	}
	if res.elapsed < BodyTimeout*9/10 || res.elapsed > BodyTimeout+5*time.Second {
		t.Fatalf("stalled body failed after %v, BodyTimeout %v", res.elapsed, BodyTimeout)
	}
	// The server dropped us: our read ends.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := nc.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled peer not dropped: read %d, %v after %v", n, err, time.Since(start))
	}
}

// TestBodyTimeoutReset: the deadline covers one body only; an idle
// connection between frames is not dropped.
func TestBodyTimeoutReset(t *testing.T) {
	got := make(chan error, 2)
	addr := serve(t, func(c *Conn) {
		for i := 0; i < 2; i++ {
			_, body, err := readFrame(c)
			if err == nil && len(body) != 100 {
				err = fmt.Errorf("body of %d bytes", len(body))
			}
			got <- err
		}
	})
	nc := dialRaw(t, addr)
	frame := append(rawHeader(100, opNodeWrite, 0, 1), make([]byte, 100)...)
	nc.Write(frame[:HeaderSize+50]) // the body arrives in two parts, so ReadBody waits with a deadline
	time.Sleep(BodyTimeout / 5)
	nc.Write(frame[HeaderSize+50:])
	if err := <-got; err != nil {
		t.Fatalf("first frame: %v", err)
	}
	time.Sleep(BodyTimeout * 3 / 2)
	nc.Write(frame)
	if err := <-got; err != nil {
		t.Fatalf("frame after an idle spell longer than BodyTimeout: %v", err)
	}
}

// serveStalled serves connections that answer their first request with the
// header of a 64-byte reply and only 32 bytes of its body, then stall until
// the test ends.
func serveStalled(t *testing.T) string {
	stop := make(chan struct{})
	addr := serve(t, func(c *Conn) {
		h, _, err := readFrame(c)
		if err != nil {
			return
		}
		c.NetConn().Write(append(rawHeader(64, h.Op, FlagReply, h.ID), make([]byte, 32)...))
		<-stop
	})
	// Registered after serve's own cleanups, so it runs before them: the
	// stalled handlers end before the server is closed.
	t.Cleanup(func() { close(stop) })
	return addr
}

// testRPCBodyTimeout: a reply that stalls mid-body fails the calls with
// ErrUnavailable within BodyTimeout and drops the connection.
func testRPCBodyTimeout(t *testing.T, dial dialer) {
	for _, into := range []bool{false, true} {
		t.Run(fmt.Sprintf("into=%v", into), func(t *testing.T) {
			r := dial(t, serveStalled(t))
			var buf []byte
			if into {
				buf = make([]byte, 64)
			}
			start := time.Now()
			c := r.Go(opNodeRead, buf, []byte("read"))
			other := r.Go(opNodeRead, nil, []byte("other"))
			err := waitCall(t, c)
			elapsed := time.Since(start)
			if !errors.Is(err, vocab.ErrUnavailable) || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("stalled reply: %v, want ErrUnavailable naming the timeout", err)
			}
			if elapsed > BodyTimeout+5*time.Second {
				t.Fatalf("stalled reply failed after %v, BodyTimeout %v", elapsed, BodyTimeout)
			}
			if err := waitCall(t, other); !errors.Is(err, vocab.ErrUnavailable) {
				t.Fatalf("other pending call: %v", err)
			}
			<-r.Closed()
		})
	}
}

// testRPCIntoSkipStalls: a wrong-length reply whose body then stalls fails
// its call as a protocol error and drops the connection like any stalled body.
func testRPCIntoSkipStalls(t *testing.T, dial dialer) {
	r := dial(t, serveStalled(t))
	c := r.Go(opNodeRead, make([]byte, 8), []byte("read"))
	other := r.Go(opNodeRead, nil, []byte("other"))
	if err := waitCall(t, c); !errors.Is(err, vocab.ErrProtocol) {
		t.Fatalf("stalled wrong-length reply: %v, want ErrProtocol", err)
	}
	if err := waitCall(t, other); !errors.Is(err, vocab.ErrUnavailable) {
		t.Fatalf("call behind a stalled reply: %v, want ErrUnavailable", err)
	}
	<-r.Closed()
}

// TestRPCCallerReadsWaiterReads: with one call in flight, its reply is read
// by the goroutine in Wait, not handed over by another (the continuation
// runs on whoever reads the reply).
func TestRPCCallerReadsWaiterReads(t *testing.T) {
	r := rpcModes[1].dial(t, serve(t, echo))
	for i := range 20 {
		var stack string
		c := r.GoThen(opFree, nil, func(*Call) {
			b := make([]byte, 64<<10)
			stack = string(b[:runtime.Stack(b, false)])
		}, []byte("x"))
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stack, "(*Call).Wait") {
			t.Fatalf("call %d: its reply was read by another goroutine:\n%s", i, stack)
		}
	}
}

// TestRPCCallerReadsHelper: replies nobody waits for are read as long as
// more than one call is in flight, so their Done channels close.
func TestRPCCallerReadsHelper(t *testing.T) {
	r := rpcModes[1].dial(t, serve(t, echo))
	calls := make([]*Call, 50)
	for i := range calls {
		calls[i] = r.Go(opFree, nil, []byte(fmt.Sprint(i)))
	}
	// All but the last finish without a Wait; the last, once alone, waits
	// for a reader.
	for i, c := range calls[:len(calls)-1] {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d of %d in flight never completed without a Wait", i, len(calls))
		}
		if c.Err != nil || string(c.Body) != fmt.Sprint(i) {
			t.Fatalf("call %d: %q, %v", i, c.Body, c.Err)
		}
	}
	last := calls[len(calls)-1]
	if err := waitCall(t, last); err != nil || string(last.Body) != fmt.Sprint(len(calls)-1) {
		t.Fatalf("last call: %q, %v", last.Body, err)
	}
}

// TestRPCCallerReadsCloseWhileReading: Close ends a Wait that is blocked
// reading a reply that never comes.
func TestRPCCallerReadsCloseWhileReading(t *testing.T) {
	addr := serve(t, func(c *Conn) { io.Copy(io.Discard, c.NetConn()) })
	r := rpcModes[1].dial(t, addr)
	c := r.Go(opSynchronize, nil)
	got := make(chan error, 1)
	go func() { got <- c.Wait() }()
	// Close once the waiter holds the read token, blocked in the read.
	for deadline := time.Now().Add(10 * time.Second); len(r.role) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never took the read token")
		}
	}
	r.Close()
	select {
	case err := <-got:
		if !errors.Is(err, vocab.ErrUnavailable) {
			t.Fatalf("Wait after Close: %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a Wait blocked reading")
	}
}

// TestRPCCallerReadsMixed: goroutines mixing single calls, pipelined ones
// waited for out of order, and calls left for the helper, all get their own
// replies (run it with -race).
func TestRPCCallerReadsMixed(t *testing.T) {
	r := rpcModes[1].dial(t, serve(t, echo))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				var calls []*Call
				for k := range 1 + (g+i)%4 {
					calls = append(calls, r.Go(opFree, nil, []byte(fmt.Sprintf("%d-%d-%d", g, i, k))))
				}
				for k := len(calls) - 1; k >= 0; k-- {
					c := calls[k]
					if err := waitCall(t, c); err != nil || string(c.Body) != fmt.Sprintf("%d-%d-%d", g, i, k) {
						t.Errorf("goroutine %d, round %d, call %d: %q, %v", g, i, k, c.Body, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// shuffler answers requests in a random order: it gathers what arrives
// until the connection has been quiet for a moment, then answers all of it
// shuffled, each with its own body.
func shuffler(seed uint64) func(c *Conn) {
	return func(c *Conn) {
		rng := mrand.New(mrand.NewPCG(seed, 1))
		type req struct {
			h    Header
			body []byte
		}
		var held []req
		for {
			_ = c.NetConn().SetReadDeadline(time.Now().Add(300 * time.Microsecond))
			h, err := c.ReadHeader()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
				for _, r := range held {
					if c.Reply(r.h, r.body) != nil {
						return
					}
				}
				held = held[:0]
				continue
			}
			if err != nil {
				return
			}
			_ = c.NetConn().SetReadDeadline(time.Time{})
			body := make([]byte, h.Len)
			if c.ReadBody(body) != nil {
				return
			}
			held = append(held, req{h, body})
		}
	}
}

// TestRPCCallerReadsAnyOrder: goroutines issuing calls, waiting for some out
// of order and leaving others to the helper, each get their own reply, in
// whatever order the server answers, and nobody waits forever (property
// test over the actions and the server's order).
func TestRPCCallerReadsAnyOrder(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		seed := rapid.Uint64().Draw(rt, "seed")
		plans := rapid.SliceOfN(rapid.SliceOfN(rapid.IntRange(0, 3), 1, 20), 1, 4).Draw(rt, "plans")
		r := rpcModes[1].dial(t, serve(t, shuffler(seed)))
		defer r.Close() // ends the server too: one connection per draw
		errs := make(chan error, len(plans))
		for g, plan := range plans {
			go func() {
				var kept []*Call
				var want []string
				check := func(c *Call, w string) error {
					if err := c.Wait(); err != nil || string(c.Body) != w {
						return fmt.Errorf("goroutine %d: call for %q: %q, %v", g, w, c.Body, err)
					}
					return nil
				}
				for i, a := range plan {
					msg := fmt.Sprintf("%d.%d", g, i)
					switch a {
					case 0, 1: // issue and keep
						kept, want = append(kept, r.Go(opFree, nil, []byte(msg))), append(want, msg)
					case 2: // a call of its own
						if body, err := r.Call(opFree, nil, []byte(msg)); err != nil || string(body) != msg {
							errs <- fmt.Errorf("goroutine %d: Call %q: %q, %v", g, msg, body, err)
							return
						}
					case 3: // wait for the latest kept call, out of order
						if k := len(kept) - 1; k >= 0 {
							if err := check(kept[k], want[k]); err != nil {
								errs <- err
								return
							}
							kept, want = kept[:k], want[:k]
						}
					}
				}
				for k := range kept {
					if err := check(kept[k], want[k]); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range plans {
			select {
			case err := <-errs:
				if err != nil {
					rt.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				rt.Fatal("a call never completed")
			}
		}
	})
}

// TestGoRacesAFailingConnection: a call made while the reader fails the
// connection (the peer hung up at once, as a node refusing a TLS client
// does) is failed by one side only, without a data race on it (run with
// -race): the caller learns from register whether it may send, never by
// reading the call's error, which the reader may be writing.
func TestGoRacesAFailingConnection(t *testing.T) {
	for i := 0; i < 200; i++ {
		a, b := net.Pipe()
		b.Close()
		r := NewRPC(NewConn(a), "peer")
		c := r.Go(opHello, nil, []byte("hi"))
		if err := c.Wait(); !errors.Is(err, vocab.ErrUnavailable) {
			t.Fatalf("call %d on a connection whose peer hung up: %v, want unavailable", i, err)
		}
	}
}

// TestFailedCallSeesClosed: a call that fails because the connection broke
// finds Closed() closed when its Wait returns, even one made while the
// connection was failing, which fails at once; the client tells a broken
// connection from an answer by it (client/reconnect.go).
func TestFailedCallSeesClosed(t *testing.T) {
	for range 20 {
		addr := serve(t, func(c *Conn) {
			c.NetConn().Read(make([]byte, 256)) // then close it, with calls still being made
		})
		r := dial(t, addr)
		var wg sync.WaitGroup
		var failed, open atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2000 {
					err := r.Go(opSynchronize, nil).Wait()
					if err == nil {
						continue
					}
					failed.Add(1)
					select {
					case <-r.Closed():
					default:
						open.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if failed.Load() == 0 {
			t.Fatal("no call failed: the connection never broke")
		}
		if n := open.Load(); n > 0 {
			t.Fatalf("%d of %d failed calls found the connection not closed", n, failed.Load())
		}
	}
}
