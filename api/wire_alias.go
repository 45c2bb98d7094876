package api

import "github.com/vgpu/vgpu/api/wire"

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

var (
	NewConn           = wire.NewConn
	NewConnFDs        = wire.NewConnFDs
	NewRPC            = wire.NewRPC
	NewRPCPush        = wire.NewRPCPush
	NewRPCCallerReads = wire.NewRPCCallerReads
	NewDecoder        = wire.NewDecoder
	DecodeError       = wire.DecodeError
	WatchPeer         = wire.WatchPeer
	CheckPeerTimeout  = wire.CheckPeerTimeout
)
