package api

import (
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api/wire"
)

// MaxHelloBody is the largest body of a Hello: its fixed fields, a tenant
// name of MaxString bytes and a session token of MaxToken. A hello's header
// that announces more is refused before anything is allocated for its body.
const MaxHelloBody = 4 + 2 + 1 + 4 + wire.MaxString + 4 + 4 + 4 + 4 + MaxToken

// ReadHello reads the first frame of a connection, which must be a Hello
// request, and checks its magic and version; self names the reader in
// messages ("mediator", "node").
//
// The whole frame must arrive by deadline, and its body is bounded by
// MaxHelloBody and read before it is decoded into anything larger than
// itself (wire.Conn.ReadFirst). The returned header is the zero Header
// when the frame must not be answered; otherwise a failed hello may be
// answered with ReplyError on the returned header.
func ReadHello(c *wire.Conn, deadline time.Time, self string) (wire.Header, *Hello, error) {
	h, body, err := c.ReadFirst(deadline, OpHello, MaxHelloBody)
	if err != nil {
		return h, nil, err
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
