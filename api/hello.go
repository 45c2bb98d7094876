package api

import (
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api/wire"
)

// The handshake every connection opens with, whatever its role: the
// peer's Hello (magic, version, role, tenant, devices wanted) and the
// HelloReply with the session and its devices.

// Magic opens every Hello.
const Magic = 0x55504756 // "VGPU"

// Version is the protocol version this build speaks. Peers must match.
const Version = 6

// Role says who is connecting.
type Role uint8

// Roles.
const (
	RoleTenant   Role = 1 // a tenant program, to a mediator
	RoleOperator Role = 2 // vgpuctl, to a mediator
	RoleMediator Role = 3 // a mediator, to a node
)

// Hello opens a connection.
//
//vgpu:wire
type Hello struct {
	Magic   uint32
	Version uint16
	Role    Role
	Tenant  string // the tenant this connection acts for; empty for operators
	Devices uint32 // virtual devices wanted (tenants); 0 means 1
	// Mediator → node only: the tenant's fair-share weight (0 means 1) and
	// the cap on its share of a device's time (0 means none), from the
	// mediator's quota file.
	Weight     uint32
	ComputeMax float32
	// Tenant → mediator only, an optional trailing field (a hello without
	// it is a client that cannot reconnect, or reconnect=0 in Python): Resumable
	// asks for a session token in the reply (HelloReply.Token), and Resume,
	// if not empty, is the token of a session to take up again after the
	// mediator restarted, instead of opening a new one.
	Resumable bool   `wire:"-"`
	Resume    string `wire:"if=Resumable,max=MaxToken"`
}

// MaxToken bounds a session token (Hello.Resume, HelloReply.Token,
// NodeAttach.Token).
const MaxToken = 64

// DeviceInfo describes a device: to a tenant its virtual device, to a
// mediator a node's physical device.
type DeviceInfo struct {
	Index  uint32
	Name   string
	Node   string // where it lives
	Memory uint64 // bytes
}

// HelloReply accepts a connection.
//
//vgpu:wire
type HelloReply struct {
	Version uint16
	Session uint64
	Devices []DeviceInfo
	// Token, an optional trailing field sent only to a Resumable hello:
	// the secret that takes this session up again after a mediator
	// restart (Hello.Resume); empty where the mediator keeps no journal.
	Resumable bool   `wire:"-"`
	Token     string `wire:"if=Resumable"`
}

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
