// Package wire is the transport every connection of vgpu speaks — tenant
// to mediator, operator to mediator, mediator to node — apart from the
// messages it carries: frames (Conn), pipelined requests and their replies
// (RPC, Call), the encoding of fields (Encoder, Decoder) and of errors,
// descriptors passed on Unix sockets (fd.go), the liveness of TCP peers
// (WatchPeer) and the observer of replies (ReplyObserver). Which
// operations exist and what their bodies hold is package api's; the wire
// knows an operation only as a number (Op), named for its errors by
// whoever registers the names (NameOps). It imports api/vocab and nothing
// else of ours.
//
// A frame is a 16-byte header (body length, operation, flags, request id)
// and a body. Requests pipeline: a peer may send many before the first
// reply, and replies carry their request's id. Bulk payloads ride at the
// end of a body and are written to the socket from the caller's memory and
// read into the receiver's (RPC.Go's into, Conn.BodyReader), without
// per-byte work.
//
// Invariants:
//   - A body is never longer than MaxBody; a header that says otherwise is a
//     protocol error and the connection is dropped, since it cannot resync.
//   - A body arrives within BodyTimeout of its header (the first frame,
//     within the handshake's deadline: Conn.ReadFirst), so a peer that
//     stalls mid-frame loses its connection.
//   - Decoders trust nothing: every length is checked against what remains
//     before anything is allocated; a malformed body is ErrProtocol, and
//     the first failure sticks (Decoder.Err).
//   - Errors cross the wire as (Code, message), the message cut to
//     MaxString on a line or UTF-8 boundary. Code survives every hop, so
//     errors.Is(err, vocab.ErrOutOfMemory) holds for a tenant whose node
//     ran out.
//   - A Call completes exactly once — with its reply, its error reply, or
//     the error that broke the connection (wrapping ErrUnavailable or
//     ErrProtocol) — and a call failed by a broken connection finds
//     RPC.Closed closed. A reply of the wrong length for a call's buffer
//     fails that call only; the connection carries on.
//   - Writes are whole frames under Conn's write lock; reads are for one
//     goroutine at a time (the RPC's reader, or the holder of its read
//     role under NewRPCCallerReads).
package wire
