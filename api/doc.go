// Package api is the messages of the wire protocol shared by tenants,
// mediators, nodes and operators: which operations exist (the Op
// constants), the handshake (Hello), and the bodies of requests and
// replies of each role. The transport that carries them — frames,
// pipelined calls, the field and error encoding, descriptor passing,
// liveness — is api/wire's; the words they share with packages that need
// no transport (error sentinels and codes, tenant and container names,
// hints, modes, sizes, default paths) are api/vocab's, re-exported here
// under api's names as aliases (vocab.go).
//
// Every connection opens with Hello; the versions must match.
//
// Invariants:
//   - A message's wire form is its fields in declaration order: the types
//     marked //vgpu:wire get Marshal and Unmarshal generated into
//     messages_gen.go by api/internal/codecgen (go generate ./api), which
//     documents the encoding and the struct tags that steer it;
//     testdata/codec_golden.txt pins the bytes of every message.
//   - Decoding a message trusts nothing (wire.Decoder): a malformed body is
//     ErrProtocol, and a body with bytes left over is refused.
//   - Opcodes are one space for every role; a number, once used, keeps its
//     meaning (the Python client, python/vgpu/_wire.py, speaks the same).
package api

//go:generate go run ./internal/codecgen
