package vocab

import (
	"errors"
	"fmt"
)

// Code is the wire form of an error class. It survives every hop: a node's
// out-of-memory reaches the tenant as out-of-memory, whatever wrapped it.
type Code uint16

// Error codes. The numbers are part of the wire protocol: append, never renumber.
const (
	CodeOK Code = iota
	CodeOutOfMemory
	CodeQuotaExceeded
	CodeInvalidAddress
	CodeInvalidArgument
	CodeUnknownKernel
	CodePermissionDenied
	CodeUnavailable
	CodeProtocol
	CodeInternal
	codeEnd
)

// Sentinels, one per code. Code that fails wraps one of them with %w and
// context that names the offending value, e.g.
//
//	fmt.Errorf("free %#x: no allocation there: %w", va, vocab.ErrInvalidAddress)
var (
	ErrOutOfMemory      = errors.New("out of memory")
	ErrQuotaExceeded    = errors.New("quota exceeded")
	ErrInvalidAddress   = errors.New("invalid address")
	ErrInvalidArgument  = errors.New("invalid argument")
	ErrUnknownKernel    = errors.New("unknown kernel")
	ErrPermissionDenied = errors.New("permission denied")
	ErrUnavailable      = errors.New("unavailable")
	ErrProtocol         = errors.New("protocol error")
	ErrInternal         = errors.New("internal error")
)

var sentinels = [codeEnd]error{
	CodeOutOfMemory:      ErrOutOfMemory,
	CodeQuotaExceeded:    ErrQuotaExceeded,
	CodeInvalidAddress:   ErrInvalidAddress,
	CodeInvalidArgument:  ErrInvalidArgument,
	CodeUnknownKernel:    ErrUnknownKernel,
	CodePermissionDenied: ErrPermissionDenied,
	CodeUnavailable:      ErrUnavailable,
	CodeProtocol:         ErrProtocol,
	CodeInternal:         ErrInternal,
}

func (c Code) String() string {
	if c == CodeOK {
		return "ok"
	}
	if c < codeEnd {
		return sentinels[c].Error()
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Known says whether c is the code of a failure this version knows: not
// CodeOK, and not a number from a newer peer.
func (c Code) Known() bool { return c > CodeOK && c < codeEnd }

// Sentinel is the sentinel of c: ErrInternal for a code not Known.
func (c Code) Sentinel() error {
	if c.Known() {
		return sentinels[c]
	}
	return ErrInternal
}

// CodeOf classifies err. Errors that wrap none of the sentinels are internal.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	for c := CodeOutOfMemory; c < codeEnd; c++ {
		if errors.Is(err, sentinels[c]) {
			return c
		}
	}
	return CodeInternal
}

// WithCode returns err wrapped with sentinel, unless err already has a
// code (CodeOf): then err itself, so that a message names its class once,
// not "…: unavailable: unavailable".
func WithCode(err, sentinel error) error {
	if CodeOf(err) != CodeInternal {
		return err
	}
	return fmt.Errorf("%w: %w", err, sentinel)
}

// RemoteError is an error that arrived over the wire. Its message is the
// remote side's full text; errors.Is matches the sentinel of its code.
type RemoteError struct {
	Code Code
	Msg  string
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap lets errors.Is(err, ErrOutOfMemory) work on remote errors.
func (e *RemoteError) Unwrap() error { return e.Code.Sentinel() }
