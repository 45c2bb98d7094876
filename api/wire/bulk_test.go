package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// bulkFrame is a frame of the sequence TestBulkFramesBypassTheBuffers
// sends: fields in front of a payload, as a node write has them.
type bulkFrame struct {
	fields, payload []byte
	held            bool // written while the connection is held, behind a small frame
}

func (f bulkFrame) len() int { return len(f.fields) + len(f.payload) }

// Bulk frames (directMin and more) leave in one vectored write, after any
// frame held in the write buffer, and are read into place: the reader's
// buffer takes no more than bulkLead of a frame that follows a bulk one,
// so its payload is not copied through the buffer. Small frames between
// them, fields read in small pieces and payloads that arrive in parts all
// keep the stream in step, over TCP and over a Unix socket that carries
// descriptors.
func TestBulkFramesBypassTheBuffers(t *testing.T) {
	pattern := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + seed)
		}
		return b
	}
	frames := []bulkFrame{
		{fields: pattern(40, 1)},
		{fields: pattern(41, 2), payload: pattern(64<<10, 3)},
		{fields: pattern(25, 4), payload: pattern(64<<10, 5)},
		{fields: pattern(9, 6)},
		{fields: pattern(57, 7), payload: pattern(directMin, 8), held: true},
		{fields: pattern(57, 9), payload: pattern(MaxChunk, 10)},
		{fields: pattern(12, 11), payload: pattern(100<<10, 12)},
	}
	for _, kind := range []string{"tcp", "unix"} {
		t.Run(kind, func(t *testing.T) {
			var wc, rc *Conn
			if kind == "tcp" {
				a, b := tcpPair(t)
				wc, rc = NewConn(a), NewConn(b)
			} else {
				a, b := unixPair(t)
				wc, rc = NewConn(a), NewConnFDs(b, b)
			}
			if wc.vec == nil {
				t.Fatalf("%s: no vectored write", kind)
			}
			errs := make(chan error, 1)
			// fatalf reports the writer's error too: one that stops the
			// writer closes the connection, and the reader fails.
			fatalf := func(format string, args ...any) {
				t.Helper()
				select {
				case err := <-errs:
					format += " (writer: %v)"
					args = append(args, err)
				case <-time.After(time.Second):
				}
				t.Fatalf(format, args...)
			}
			go func() {
				for i, f := range frames {
					if f.held {
						wc.Hold()
						if err := wc.WriteFrame(Op(100), 0, uint64(i)+100, []byte("held")); err != nil {
							errs <- err
							return
						}
					}
					if err := wc.WriteFrame(Op(i), 0, uint64(i), f.fields, f.payload); err != nil {
						errs <- err
						return
					}
					if f.held {
						// The held frame went out first, and nothing of the
						// bulk one stayed behind in the buffer.
						if n := wc.w.Buffered(); n != 0 {
							wc.Close()
							errs <- fmt.Errorf("frame %d: %d bytes left in the write buffer while held", i, n)
							return
						}
						if err := wc.Release(); err != nil {
							errs <- err
							return
						}
					}
				}
				errs <- nil
			}()
			prevBulk := false
			bounded := 0 // headers read after a bulk frame into an empty buffer
			for i, f := range frames {
				if f.held {
					h, body, err := readFrame(rc)
					if err != nil || h.ID != uint64(i)+100 || string(body) != "held" {
						fatalf("frame before %d: %+v %q %v, want the held frame", i, h, body, err)
					}
				}
				// The bound holds for a header read into a buffer that the
				// bulk frame before it left (nearly) empty; a writer that
				// got ahead of a small frame's read has its later frames
				// buffered already, as small frames share the buffer.
				capped := prevBulk && rc.Buffered() < HeaderSize
				if capped {
					// Once the frame has arrived, an uncapped read would
					// draw its payload into the buffer.
					for deadline := time.Now().Add(10 * time.Second); rc.Arrived() < HeaderSize+min(f.len(), 32<<10); {
						if time.Now().After(deadline) {
							fatalf("frame %d did not arrive", i)
						}
						time.Sleep(time.Millisecond)
					}
				}
				h, err := rc.ReadHeader()
				if err != nil {
					fatalf("frame %d: %v", i, err)
				}
				if h.ID != uint64(i) || int(h.Len) != f.len() {
					fatalf("frame %d: header %+v, want id %d and %d bytes", i, h, i, f.len())
				}
				if capped {
					bounded++
					if rc.Buffered() > bulkLead {
						fatalf("frame %d after a bulk one: %d bytes buffered, at most %d wanted", i, rc.Buffered(), bulkLead)
					}
				}
				body := rc.BodyReader(int(h.Len))
				got := make([]byte, h.Len)
				// The fields a byte at a time, then the payload whole.
				for j := range f.fields {
					if _, err := io.ReadFull(body, got[j:j+1]); err != nil {
						fatalf("frame %d field byte %d: %v", i, j, err)
					}
				}
				if _, err := io.ReadFull(body, got[len(f.fields):]); err != nil {
					fatalf("frame %d payload: %v", i, err)
				}
				if n, err := body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					fatalf("frame %d: read past its body: %d, %v", i, n, err)
				}
				if !bytes.Equal(got[:len(f.fields)], f.fields) || !bytes.Equal(got[len(f.fields):], f.payload) {
					fatalf("frame %d: body differs from what was sent", i)
				}
				prevBulk = int(h.Len) >= directMin
			}
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			// The frame after the largest payload, read straight into
			// place, always starts on an empty buffer.
			if bounded == 0 {
				t.Fatal("no header was read after a bulk frame into an empty buffer: the bound went unchecked")
			}
			sent, _ := wc.Counts()
			if _, recv := rc.Counts(); sent != recv {
				t.Fatalf("%d bytes sent, %d read", sent, recv)
			}
		})
	}
}

// A reply read by GoThenScatter lands in the pieces in order, a bulk one
// too; a reply of another length fails its call as a protocol error and
// the connection carries on.
func TestGoThenScatter(t *testing.T) {
	for _, mode := range rpcModes {
		t.Run(mode.name, func(t *testing.T) {
			r := mode.dial(t, serve(t, echo))
			for _, size := range []int{10, 100 << 10} {
				body := make([]byte, size)
				for i := range body {
					body[i] = byte(i*13 + size)
				}
				a, b, c := make([]byte, size/5), make([]byte, 0), make([]byte, size-size/5)
				then := make(chan bool, 1)
				call := r.GoThenScatter(opNodeRead, [][]byte{a, b, c}, func(*Call) { then <- true }, body)
				if err := waitCall(t, call); err != nil {
					t.Fatalf("%d bytes: %v", size, err)
				}
				if !<-then {
					t.Fatal("continuation did not run")
				}
				if !bytes.Equal(append(append(a, b...), c...), body) || call.Body != nil {
					t.Fatalf("%d bytes: the pieces hold other bytes than the reply", size)
				}
			}
			call := r.GoThenScatter(opNodeRead, [][]byte{make([]byte, 3), make([]byte, 4)}, nil, []byte("six!!!"))
			if err := waitCall(t, call); !errors.Is(err, vocab.ErrProtocol) {
				t.Fatalf("reply of 6 bytes into pieces of 7: %v, want ErrProtocol", err)
			}
			if _, err := r.Call(opNodeRead, nil, []byte("still")); err != nil {
				t.Fatalf("call after a reply of the wrong length: %v", err)
			}
		})
	}
}

// A bulk frame's last read may take the first bytes of the next frame's
// header and no more (the peer had sent no more yet): the read for the rest
// of the header is capped as a whole header's would be, so the payload
// behind it is not drawn into the buffer.
func TestHeaderSplitAfterBulkFrame(t *testing.T) {
	a, b := unixPair(t)
	rc := NewConn(b)
	frame := func(id uint64, n int) []byte {
		f := make([]byte, HeaderSize+n)
		binary.LittleEndian.PutUint32(f[0:], uint32(n))
		binary.LittleEndian.PutUint64(f[8:], id)
		return f
	}
	first, second := frame(1, directMin), frame(2, 64<<10)
	const split = 10 // bytes of the second header sent with the first frame
	if _, err := a.Write(append(first, second[:split]...)); err != nil {
		t.Fatal(err)
	}
	if h, err := rc.ReadHeader(); err != nil || h.ID != 1 {
		t.Fatalf("first header: %+v, %v", h, err)
	}
	// The body in pieces smaller than directMin, through the buffer: the
	// last piece's read takes the second header's first bytes with it.
	body := rc.BodyReader(directMin)
	if _, err := io.ReadFull(body, make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyBuffer(io.Discard, body, make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	if rc.Buffered() != split {
		t.Fatalf("after the first frame: %d bytes buffered, want the %d of the second header sent with it", rc.Buffered(), split)
	}
	if _, err := a.Write(second[split:]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); rc.Arrived() < 32<<10; {
		if time.Now().After(deadline) {
			t.Fatal("the second frame did not arrive")
		}
		time.Sleep(time.Millisecond)
	}
	if h, err := rc.ReadHeader(); err != nil || h.ID != 2 || h.Len != 64<<10 {
		t.Fatalf("second header: %+v, %v", h, err)
	}
	if n := rc.Buffered(); n > bulkLead {
		t.Fatalf("after a header split across reads: %d bytes buffered, at most %d wanted", n, bulkLead)
	}
}
