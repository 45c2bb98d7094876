// Package api is the wire protocol shared by tenants, mediators, nodes and
// operators: frames, requests, replies and error codes. The words they share
// with packages that need no transport (error sentinels and codes, tenant
// and container names, hints, modes, sizes, default paths) are api/vocab's;
// api re-exports them under its own names as aliases (vocab.go).
//
// A frame is a 16-byte header (body length, operation, flags, request id)
// and a body. Every connection opens with Hello; the versions must match.
// Requests pipeline: a peer may send many before the first reply, and
// replies carry their request's id. Bulk payloads ride at the end of a body
// and are written to the socket from the caller's memory and read into the
// receiver's, without per-byte work.
//
// Invariants:
//   - A body is never longer than MaxBody; a header that says otherwise is a
//     protocol error and the connection is dropped, since it cannot resync.
//   - Decoders trust nothing: every length is checked against what remains
//     before anything is allocated; a malformed body is ErrProtocol.
//   - A message's wire form is its fields in declaration order: the types
//     marked //vgpu:wire get Marshal and Unmarshal generated into
//     messages_gen.go by api/internal/codecgen (go generate ./api), which
//     documents the encoding and the struct tags that steer it;
//     testdata/codec_golden.txt pins the bytes of every message.
//   - Errors cross the wire as (Code, message). Code survives every hop, so
//     errors.Is(err, ErrOutOfMemory) holds for a tenant whose node ran out.
package api

//go:generate go run ./internal/codecgen
