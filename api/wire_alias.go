package api

import (
	"net"
	"time"

	"github.com/vgpu/vgpu/api/wire"
)

// Temporary: the transport moved to api/wire. These names keep importers
// that still say api.Conn, api.RPC, … compiling until they name wire
// themselves; they are the same types and values, not copies.

type (
	Op            = wire.Op
	Header        = wire.Header
	Conn          = wire.Conn
	RPC           = wire.RPC
	Call          = wire.Call
	ReplyObserver = wire.ReplyObserver
	Encoder       = wire.Encoder
	Decoder       = wire.Decoder
)

const (
	HeaderSize         = wire.HeaderSize
	MaxChunk           = wire.MaxChunk
	MaxBody            = wire.MaxBody
	MaxString          = wire.MaxString
	MaxList            = wire.MaxList
	MaxQueuedFDs       = wire.MaxQueuedFDs
	FlagReply          = wire.FlagReply
	FlagError          = wire.FlagError
	FlagPush           = wire.FlagPush
	DefaultPeerTimeout = wire.DefaultPeerTimeout
	MinPeerTimeout     = wire.MinPeerTimeout
	MaxPeerTimeout     = wire.MaxPeerTimeout
)

// Forwarders, not function variables: a call through a variable is never
// inlined, and its arguments escape.

func NewConn(nc net.Conn) *wire.Conn                      { return wire.NewConn(nc) }
func NewConnFDs(nc net.Conn, uc *net.UnixConn) *wire.Conn { return wire.NewConnFDs(nc, uc) }
func NewRPC(conn *wire.Conn, name string) *wire.RPC       { return wire.NewRPC(conn, name) }
func NewRPCPush(conn *wire.Conn, name string, push func(*wire.RPC, wire.Op, []byte)) *wire.RPC {
	return wire.NewRPCPush(conn, name, push)
}
func NewRPCCallerReads(conn *wire.Conn, name string) *wire.RPC {
	return wire.NewRPCCallerReads(conn, name)
}
func NewDecoder(b []byte) *wire.Decoder { return wire.NewDecoder(b) }
func DecodeError(body []byte) error     { return wire.DecodeError(body) }
func WatchPeer(tc *net.TCPConn, peer string, bound time.Duration) (net.Conn, error) {
	return wire.WatchPeer(tc, peer, bound)
}
func CheckPeerTimeout(d time.Duration) error { return wire.CheckPeerTimeout(d) }
