package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/wire"
)

// helloPipe returns the reading end of a pipe whose other end has written
// a frame header (len, op, flags) followed by body.
func helloPipe(t *testing.T, n uint32, op wire.Op, flags uint16, body []byte) (*wire.Conn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	var hdr [wire.HeaderSize]byte
	binary.LittleEndian.PutUint32(hdr[0:], n)
	binary.LittleEndian.PutUint16(hdr[4:], uint16(op))
	binary.LittleEndian.PutUint16(hdr[6:], flags)
	binary.LittleEndian.PutUint64(hdr[8:], 7)
	go func() { _, _ = b.Write(append(hdr[:], body...)) }()
	return wire.NewConn(a), b
}

// MaxHelloBody is exactly the largest Hello: a change to Hello's fields
// must change it.
func TestMaxHelloBodyFitsTheLargestHello(t *testing.T) {
	h := Hello{Magic: Magic, Version: Version, Role: RoleTenant, Tenant: strings.Repeat("t", wire.MaxString), Resumable: true, Resume: strings.Repeat("r", MaxToken)}
	if n := len(Encode(&h)); n != MaxHelloBody {
		t.Fatalf("largest hello encodes to %d bytes, MaxHelloBody is %d", n, MaxHelloBody)
	}
}

func TestReadHello(t *testing.T) {
	good := Encode(&Hello{Magic: Magic, Version: Version, Role: RoleTenant, Tenant: "alice"})
	deadline := func() time.Time { return time.Now().Add(5 * time.Second) }
	t.Run("accepts a hello", func(t *testing.T) {
		c, _ := helloPipe(t, uint32(len(good)), OpHello, 0, good)
		h, hello, err := ReadHello(c, deadline(), "test")
		if err != nil || hello.Tenant != "alice" || h.ID != 7 {
			t.Fatalf("ReadHello = %+v, %+v, %v", h, hello, err)
		}
	})
	// A reply, an error or a push where a hello was due ends the
	// connection unanswered: the zero header says so.
	for _, flags := range []uint16{wire.FlagReply, wire.FlagReply | wire.FlagError, wire.FlagPush} {
		c, _ := helloPipe(t, uint32(len(good)), OpHello, flags, good)
		h, _, err := ReadHello(c, deadline(), "test")
		if !errors.Is(err, ErrProtocol) || h != (wire.Header{}) || !strings.Contains(err.Error(), "want a request") {
			t.Errorf("hello with flags %#x: header %+v, %v; want a protocol error and no header to answer", flags, h, err)
		}
	}
	// A header announcing more than a hello is refused before its body
	// is read or allocated: nothing follows the header here.
	c, _ := helloPipe(t, MaxHelloBody+1, OpHello, 0, nil)
	h, _, err := ReadHello(c, deadline(), "test")
	if !errors.Is(err, ErrProtocol) || h.ID != 7 || !strings.Contains(err.Error(), fmt.Sprintf("%d-byte body", MaxHelloBody+1)) {
		t.Errorf("oversized hello: %+v, %v; want a protocol error naming the size, answerable", h, err)
	}
	c, _ = helloPipe(t, uint32(len(good)), OpMalloc, 0, good)
	if h, _, err := ReadHello(c, deadline(), "test"); !errors.Is(err, ErrProtocol) || h.Op != OpMalloc {
		t.Errorf("first request malloc: %+v, %v", h, err)
	}
	bad := Encode(&Hello{Magic: Magic, Version: Version + 1})
	c, _ = helloPipe(t, uint32(len(bad)), OpHello, 0, bad)
	if _, _, err := ReadHello(c, deadline(), "test"); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "this test speaks") {
		t.Errorf("other version: %v", err)
	}
}
