package api

import "github.com/vgpu/vgpu/api/vocab"

// The shared vocabulary lives in api/vocab, which packages that need only
// it import instead of the transport. api re-exports it under the names it
// always had: these are the same types and values, not copies, so that
// errors.Is(err, api.ErrOutOfMemory) and errors.Is(err,
// vocab.ErrOutOfMemory) agree, and an api.Hint is a vocab.Hint.

// Error codes and sentinels (vocab/errors.go).
type (
	Code        = vocab.Code
	RemoteError = vocab.RemoteError
)

const (
	CodeOK               = vocab.CodeOK
	CodeOutOfMemory      = vocab.CodeOutOfMemory
	CodeQuotaExceeded    = vocab.CodeQuotaExceeded
	CodeInvalidAddress   = vocab.CodeInvalidAddress
	CodeInvalidArgument  = vocab.CodeInvalidArgument
	CodeUnknownKernel    = vocab.CodeUnknownKernel
	CodePermissionDenied = vocab.CodePermissionDenied
	CodeUnavailable      = vocab.CodeUnavailable
	CodeProtocol         = vocab.CodeProtocol
	CodeInternal         = vocab.CodeInternal
)

var (
	ErrOutOfMemory      = vocab.ErrOutOfMemory
	ErrQuotaExceeded    = vocab.ErrQuotaExceeded
	ErrInvalidAddress   = vocab.ErrInvalidAddress
	ErrInvalidArgument  = vocab.ErrInvalidArgument
	ErrUnknownKernel    = vocab.ErrUnknownKernel
	ErrPermissionDenied = vocab.ErrPermissionDenied
	ErrUnavailable      = vocab.ErrUnavailable
	ErrProtocol         = vocab.ErrProtocol
	ErrInternal         = vocab.ErrInternal

	CodeOf   = vocab.CodeOf
	WithCode = vocab.WithCode
)

// Residency hints (vocab/hint.go).
type Hint = vocab.Hint

const (
	HintNone       = vocab.HintNone
	HintWeight     = vocab.HintWeight
	HintActivation = vocab.HintActivation
	HintKVCache    = vocab.HintKVCache
	HintStaging    = vocab.HintStaging
)

var ParseHint = vocab.ParseHint

// Shared-buffer modes (vocab/mode.go).
type Mode = vocab.Mode

const (
	ModePrivate   = vocab.ModePrivate
	ModeImmutable = vocab.ModeImmutable
	ModeVersioned = vocab.ModeVersioned
	ModeCoherent  = vocab.ModeCoherent
)

// Sizes and runs of device memory (vocab/size.go).
type Extent = vocab.Extent

var (
	ParseSize  = vocab.ParseSize
	FormatSize = vocab.FormatSize
	ExtentsLen = vocab.ExtentsLen
)
