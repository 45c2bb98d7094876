package wire

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair returns the two ends of a connected Unix stream socket.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		nc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = nc.(*net.UnixConn)
		t.Cleanup(func() { nc.Close() })
	}
	return ends[0], ends[1]
}

// A frame bigger than the socket's buffers leaves in several writes, its
// descriptor with the first: the peer gets all of it and the descriptor.
func TestWriteFrameFDWritesAllOfALargeFrame(t *testing.T) {
	a, b := unixPair(t)
	if err := a.SetWriteBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	if err := b.SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	body := bytes.Repeat([]byte("0123456789abcdef"), MaxChunk/16)
	type got struct {
		body []byte
		fd   int
		err  error
	}
	done := make(chan got, 1)
	go func() {
		c := NewConnFDs(b, b)
		h, err := c.ReadHeader()
		if err != nil {
			done <- got{err: err}
			return
		}
		p := make([]byte, h.Len)
		if err := c.ReadBody(p); err != nil {
			done <- got{err: err}
			return
		}
		fd, err := c.TakeFD()
		done <- got{p, fd, err}
	}()
	if err := NewConn(a).WriteFrameFD(opHostRegister, 7, int(pw.Fd()), body); err != nil {
		t.Fatal(err)
	}
	a.Close() // a frame cut short now ends in EOF
	r := <-done
	if r.err != nil {
		t.Fatalf("reading the frame: %v", r.err)
	}
	defer unix.Close(r.fd)
	if !bytes.Equal(r.body, body) {
		t.Fatalf("got a %d-byte body, want the %d bytes sent", len(r.body), len(body))
	}
	if _, err := unix.Write(r.fd, []byte("x")); err != nil {
		t.Fatalf("write to the descriptor received: %v", err)
	}
	x := make([]byte, 1)
	if n, err := pr.Read(x); n != 1 || x[0] != 'x' {
		t.Fatalf("the descriptor received is not the pipe sent: read %q, %v", x[:n], err)
	}
}

// Descriptors that a read returns after the connection closed its queue are
// closed too, not queued where nobody takes them.
func TestFDsArrivingAfterCloseAreClosed(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	r := &fdReader{}
	r.closeAll()
	if err := r.keep(unix.UnixRights(p[1])); !errors.Is(err, net.ErrClosed) {
		t.Errorf("descriptor kept after close: %v", err)
	}
	// The write end went with the queue: the read end sees end of file.
	if n, err := unix.Read(p[0], make([]byte, 1)); n != 0 || err != nil {
		unix.Close(p[1])
		t.Fatalf("read end of a pipe whose write end was handed over: %d, %v; want end of file", n, err)
	}
	if fd, ok := r.take(); ok {
		t.Fatalf("took descriptor %d after close", fd)
	}
}
