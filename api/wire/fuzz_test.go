package wire

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// Fuzz targets for every decoder of untrusted bytes. Seed corpora live in
// testdata/fuzz/<FuzzName>/; plain `go test` runs them, and
// `go test -run xxx -fuzz FuzzName ./api/` explores from them.

// FuzzDecodeError: an error reply body decodes to a RemoteError of a known
// code, or to a protocol error; a RemoteError of a real code re-encodes to
// the same bytes.
func FuzzDecodeError(f *testing.F) {
	enc := func(code vocab.Code, msg string) []byte {
		e := Encoder{}
		e.U16(uint16(code))
		e.String(msg)
		return e.B
	}
	f.Add(enc(vocab.CodeOutOfMemory, "node n1: no frames left"))
	f.Add(enc(vocab.CodeOK, "ok?"))
	f.Add(enc(999, "from the future"))
	f.Add(enc(vocab.CodeProtocol, "")[:3])
	f.Fuzz(func(t *testing.T, data []byte) {
		err := DecodeError(data)
		var re *vocab.RemoteError
		switch {
		case err == nil:
			t.Fatal("DecodeError returned nil")
		case errors.As(err, &re):
			if !re.Code.Known() {
				t.Fatalf("RemoteError with code %d", re.Code)
			}
			if !errors.Is(err, re.Code.Sentinel()) || vocab.CodeOf(err) != re.Code {
				t.Fatalf("RemoteError %v does not match its sentinel", re.Code)
			}
			if len(re.Msg) > MaxString+100 {
				t.Fatalf("message of %d bytes", len(re.Msg))
			}
			if re.Code != vocab.CodeProtocol {
				if again := enc(re.Code, re.Msg); !bytes.Equal(again, data) {
					t.Fatalf("accepted %x but re-encodes as %x", data, again)
				}
			}
		case !errors.Is(err, vocab.ErrProtocol):
			t.Fatalf("DecodeError: %v, want a RemoteError or ErrProtocol", err)
		}
	})
}

// FuzzFrameReader feeds arbitrary bytes to Conn.ReadHeader/ReadBody over a
// net.Pipe. The reader never panics, never accepts a body over MaxBody, and
// the frames it returns are exactly the bytes it read.
func FuzzFrameReader(f *testing.F) {
	two := append(rawHeader(3, opMalloc, 0, 1), 'a', 'b', 'c')
	two = append(two, rawHeader(0, opStatus, FlagReply, 2)...)
	f.Add(two)
	f.Add(rawHeader(MaxBody+1, opNodeWrite, 0, 1))
	f.Add(append(rawHeader(100, opNodeWrite, 0, 1), 1, 2, 3))
	f.Add(rawHeader(1, opHello, 0, 1)[:10])
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.Write(data) // fails once the reader gives up and closes b
			a.Close()
		}()
		c := NewConn(b)
		var got []byte
		for {
			h, err := c.ReadHeader()
			if err != nil {
				if errors.Is(err, vocab.ErrProtocol) && h.Len <= MaxBody {
					t.Fatalf("header %+v refused: %v", h, err)
				}
				break
			}
			if h.Len > MaxBody {
				t.Fatalf("accepted a header of %d bytes", h.Len)
			}
			body := make([]byte, h.Len)
			if err := c.ReadBody(body); err != nil {
				break
			}
			got = append(got, rawHeader(h.Len, h.Op, h.Flags, h.ID)...)
			got = append(got, body...)
		}
		c.Close()
		<-done
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("frames read do not match the input")
		}
		if tail := len(data) - len(got); tail >= HeaderSize {
			// What stopped the reader must have been a bad or cut frame.
			h := rawHeaderLen(data[len(got):])
			if h <= MaxBody && uint32(tail-HeaderSize) >= h {
				t.Fatalf("reader stopped before a complete frame of %d bytes", h)
			}
		}
	})
}

// rawHeaderLen returns the body length a raw header announces.
func rawHeaderLen(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// FuzzRPCReplies plays an arbitrary byte stream as the server's side of an
// RPC with n calls in flight. Every call completes, and every failure is
// typed: nothing a peer sends can produce an untyped error or a hang.
func FuzzRPCReplies(f *testing.F) {
	reply := func(n int, flags uint16, id uint64, body ...byte) []byte {
		return append(rawHeader(uint32(n), opNodeRead, flags, id), body...)
	}
	var ok []byte
	ok = append(ok, reply(3, FlagReply, 2, 1, 2, 3)...)           // call 2 reads into 3 bytes
	ok = append(ok, reply(2, FlagReply, 1, 'h', 'i')...)          // call 1 takes a body
	ok = append(ok, reply(3, FlagReply|FlagError, 3, 1, 0, 0)...) // malformed error body
	f.Add(uint8(3), ok)
	errBody := append([]byte{byte(vocab.CodeOutOfMemory), 0, 3, 0, 0, 0}, "oom"...)
	f.Add(uint8(1), reply(len(errBody), FlagReply|FlagError, 1, errBody...))
	f.Add(uint8(2), reply(5, FlagReply, 2, 1, 2, 3, 4, 5))          // wrong length for into
	f.Add(uint8(1), reply(0, 0, 1))                                 // a request, not a reply
	f.Add(uint8(1), reply(0, FlagReply, 99))                        // unknown id
	f.Add(uint8(1), rawHeader(MaxBody+1, opNodeRead, FlagReply, 1)) // oversized
	f.Add(uint8(4), reply(8, FlagReply, 1, 1, 2))                   // cut body
	f.Fuzz(func(t *testing.T, k uint8, data []byte) {
		n := int(k%8) + 1
		a, b := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			defer a.Close()
			sc := NewConn(a)
			for i := 0; i < n; i++ {
				if _, _, err := readFrame(sc); err != nil {
					return
				}
			}
			a.Write(data)
		}()
		r := NewRPC(NewConn(b), "fuzz-peer")
		calls := make([]*Call, n)
		for i := range calls {
			var into []byte
			if i%2 == 1 { // even ids (odd i) read into a buffer of 3 bytes
				into = make([]byte, 3)
			}
			calls[i] = r.Go(opNodeRead, into, []byte{byte(i)})
		}
		for i, c := range calls {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("call %d never completed", i)
			}
			if c.Err != nil && !typed(c.Err) {
				t.Fatalf("call %d failed with an untyped error: %v", i, c.Err)
			}
			if c.Err == nil && c.into != nil && c.Body != nil {
				t.Fatalf("call %d read into a buffer and has a body", i)
			}
		}
		r.Close()
		<-served
	})
}
