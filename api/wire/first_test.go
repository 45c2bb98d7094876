package wire

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// firstPipe returns a Conn reading a pipe whose other end has written a
// frame header (len, op, flags) followed by body.
func firstPipe(t *testing.T, n uint32, op Op, flags uint16, body []byte) *Conn {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	var hdr [HeaderSize]byte
	binary.LittleEndian.PutUint32(hdr[0:], n)
	binary.LittleEndian.PutUint16(hdr[4:], uint16(op))
	binary.LittleEndian.PutUint16(hdr[6:], flags)
	binary.LittleEndian.PutUint64(hdr[8:], 7)
	go func() { _, _ = b.Write(append(hdr[:], body...)) }()
	return NewConn(a)
}

// TestReadFirst: the first frame must be a request of the expected
// operation within the body limit; what is refused says why, and a frame
// that is not a request comes back with the zero Header (not answered).
func TestReadFirst(t *testing.T) {
	deadline := func() time.Time { return time.Now().Add(5 * time.Second) }
	h, body, err := firstPipe(t, 3, opHello, 0, []byte("abc")).ReadFirst(deadline(), opHello, 8)
	if err != nil || h.ID != 7 || string(body) != "abc" {
		t.Fatalf("good first frame: %+v %q %v", h, body, err)
	}
	for name, tc := range map[string]struct {
		n       uint32
		op      Op
		flags   uint16
		want    string
		zeroHdr bool
	}{
		"reply":     {0, opHello, FlagReply, "want a request", true},
		"other op":  {0, opMalloc, 0, "first request is malloc, want hello", false},
		"too large": {9, opHello, 0, "hello announces a 9-byte body, limit 8", false},
	} {
		h, _, err := firstPipe(t, tc.n, tc.op, tc.flags, nil).ReadFirst(deadline(), opHello, 8)
		if !errors.Is(err, vocab.ErrProtocol) || !strings.Contains(err.Error(), tc.want) || (h == (Header{})) != tc.zeroHdr {
			t.Errorf("%s: %+v, %v; want ErrProtocol saying %q", name, h, err, tc.want)
		}
	}
}

// The handshake's deadline covers the body: a peer that sends a header
// and stalls is dropped at the deadline, not after BodyTimeout.
func TestReadFirstStalledBodyKeepsTheDeadline(t *testing.T) {
	c := firstPipe(t, 64, opHello, 0, nil)
	start := time.Now()
	_, _, err := c.ReadFirst(start.Add(100*time.Millisecond), opHello, 128)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled body: %v, want the deadline exceeded", err)
	}
	if d := time.Since(start); d >= testBodyTimeout {
		t.Fatalf("stalled body dropped after %v: the body timeout (%v) replaced the handshake's deadline", d, testBodyTimeout)
	}
}
