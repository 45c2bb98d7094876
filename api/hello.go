package api

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// MaxHelloBody is the largest body of a Hello: its fixed fields, a tenant
// name of MaxString bytes and a session token of MaxToken. A hello's header
// that announces more is refused before anything is allocated for its body.
const MaxHelloBody = 4 + 2 + 1 + 4 + MaxString + 4 + 4 + 4 + 4 + MaxToken

// ReadHello reads the first frame of a connection, which must be a Hello
// request, and checks its magic and version; self names the reader in
// messages ("mediator", "node").
//
// The whole frame, header and body, must arrive by deadline: unlike
// ReadBody, it never moves the connection's deadline to BodyTimeout, so a
// peer that sends a header and stalls holds the connection for the
// handshake's time and no longer. The body is bounded by MaxHelloBody and
// read before it is decoded into anything larger than itself.
//
// The returned header is the zero Header when the frame must not be
// answered: it could not be read, or it is not a request (a reply, an error
// or a push where a hello was due ends the connection unanswered, as
// protocol errors on a frame that is not a request do). Otherwise a failed
// hello may be answered with ReplyError on the returned header.
func ReadHello(c *Conn, deadline time.Time, self string) (Header, *Hello, error) {
	_ = c.nc.SetDeadline(deadline)
	defer c.nc.SetDeadline(time.Time{})
	h, err := c.ReadHeader()
	if err != nil {
		return Header{}, nil, fmt.Errorf("hello: %w", err)
	}
	if h.Flags != 0 {
		return Header{}, nil, fmt.Errorf("first frame (%v, id %d) has flags %#x, want a request: %w", h.Op, h.ID, h.Flags, ErrProtocol)
	}
	if h.Op != OpHello {
		// Its body is not read: the connection ends here.
		return h, nil, fmt.Errorf("first request is %v, want hello: %w", h.Op, ErrProtocol)
	}
	if h.Len > MaxHelloBody {
		return h, nil, fmt.Errorf("hello announces a %d-byte body, limit %d: %w", h.Len, MaxHelloBody, ErrProtocol)
	}
	body := make([]byte, h.Len)
	n, err := io.ReadFull(c.r, body)
	c.recv.Add(uint64(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, nil, fmt.Errorf("hello body: %w", err)
	}
	var hello Hello
	switch err := Decode(body, &hello); {
	case err != nil:
		return h, nil, fmt.Errorf("hello: %w", err)
	case hello.Magic != Magic:
		return h, nil, fmt.Errorf("hello magic %#x, want %#x: %w", hello.Magic, Magic, ErrProtocol)
	case hello.Version != Version:
		return h, nil, fmt.Errorf("protocol version %d, this %s speaks %d: %w", hello.Version, self, Version, ErrProtocol)
	}
	return h, &hello, nil
}
