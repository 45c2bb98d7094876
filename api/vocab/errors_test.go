package vocab

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

// allCodes lists every error code but OK, with its sentinel.
var allCodes = []struct {
	code Code
	err  error
}{
	{CodeOutOfMemory, ErrOutOfMemory},
	{CodeQuotaExceeded, ErrQuotaExceeded},
	{CodeInvalidAddress, ErrInvalidAddress},
	{CodeInvalidArgument, ErrInvalidArgument},
	{CodeUnknownKernel, ErrUnknownKernel},
	{CodePermissionDenied, ErrPermissionDenied},
	{CodeUnavailable, ErrUnavailable},
	{CodeProtocol, ErrProtocol},
	{CodeInternal, ErrInternal},
}

func TestAllCodesListed(t *testing.T) {
	if len(allCodes) != int(codeEnd)-1 {
		t.Fatalf("allCodes has %d codes, the package %d", len(allCodes), codeEnd-1)
	}
	for i, c := range allCodes {
		if c.code != Code(i+1) || sentinels[c.code] != c.err || c.code.Sentinel() != c.err || !c.code.Known() {
			t.Errorf("allCodes[%d] = %v/%v, want code %d with its sentinel", i, c.code, c.err, i+1)
		}
	}
}

func TestCodeOf(t *testing.T) {
	if got := CodeOf(nil); got != CodeOK {
		t.Errorf("CodeOf(nil) = %v", got)
	}
	if got := CodeOf(errors.New("boom")); got != CodeInternal {
		t.Errorf("CodeOf(plain error) = %v, want internal", got)
	}
	if got := CodeOf(io.EOF); got != CodeInternal {
		t.Errorf("CodeOf(io.EOF) = %v, want internal", got)
	}
	for _, c := range allCodes {
		if got := CodeOf(c.err); got != c.code {
			t.Errorf("CodeOf(%v) = %v, want %v", c.err, got, c.code)
		}
		w := fmt.Errorf("outer: %w", fmt.Errorf("inner %#x: %w", 0x1000, c.err))
		if got := CodeOf(w); got != c.code {
			t.Errorf("CodeOf(%q) = %v, want %v", w, got, c.code)
		}
		j := errors.Join(errors.New("unrelated"), w)
		if got := CodeOf(j); got != c.code {
			t.Errorf("CodeOf(join %q) = %v, want %v", j, got, c.code)
		}
		r := &RemoteError{Code: c.code, Msg: "remote says no"}
		if got := CodeOf(fmt.Errorf("hop: %w", r)); got != c.code {
			t.Errorf("CodeOf(remote %v) = %v", c.code, got)
		}
		if !errors.Is(r, c.err) {
			t.Errorf("RemoteError{%v} is not %v", c.code, c.err)
		}
		if c.code.String() != c.err.Error() {
			t.Errorf("Code(%d).String() = %q, want %q", c.code, c.code.String(), c.err.Error())
		}
	}
	if s := CodeOK.String(); s != "ok" {
		t.Errorf("CodeOK.String() = %q", s)
	}
	if s := Code(999).String(); s != "code(999)" {
		t.Errorf("Code(999).String() = %q", s)
	}
}

// WithCode leaves an error of a class as it is and gives one of none the
// class, keeping what it wraps.
func TestWithCode(t *testing.T) {
	silent := fmt.Errorf("node n1 silent for 3s: %w", ErrUnavailable)
	if got := WithCode(silent, ErrUnavailable); got != silent {
		t.Errorf("WithCode(%q) = %q, want it unchanged", silent, got)
	}
	if got := WithCode(&RemoteError{Code: CodeQuotaExceeded, Msg: "over"}, ErrUnavailable); CodeOf(got) != CodeQuotaExceeded {
		t.Errorf("WithCode of a remote quota error = %q, code %v", got, CodeOf(got))
	}
	got := WithCode(io.EOF, ErrUnavailable)
	if !errors.Is(got, io.EOF) || !errors.Is(got, ErrUnavailable) || got.Error() != "EOF: unavailable" {
		t.Errorf("WithCode(io.EOF) = %q", got)
	}
}

func TestRemoteErrorOutOfRange(t *testing.T) {
	for _, c := range []Code{CodeOK, codeEnd, 999, 0xffff} {
		r := &RemoteError{Code: c, Msg: "odd"}
		if !errors.Is(r, ErrInternal) || CodeOf(r) != CodeInternal {
			t.Errorf("RemoteError{Code: %d} unwraps to %v, want internal", c, errors.Unwrap(r))
		}
		if r.Error() != "odd" {
			t.Errorf("RemoteError.Error() = %q", r.Error())
		}
	}
}
