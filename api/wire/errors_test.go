package wire

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vgpu/vgpu/api/vocab"
)

// allCodes lists every error code but OK, with its sentinel (the
// vocabulary's own test pins the list).
var allCodes = func() (cs []struct {
	code vocab.Code
	err  error
}) {
	for c := vocab.CodeOK + 1; c.Known(); c++ {
		cs = append(cs, struct {
			code vocab.Code
			err  error
		}{c, c.Sentinel()})
	}
	return cs
}()

// typed reports whether err wraps one of the sentinels: what the error
// contract promises for every failure that leaves this package.
func typed(err error) bool {
	for _, c := range allCodes {
		if errors.Is(err, c.err) {
			return true
		}
	}
	return false
}

// hop sends err as an error reply over a Conn, the way a server answers a
// request, and returns what the requester decodes.
func hop(t *testing.T, err error) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv, cli := NewConn(a), NewConn(b)
	req := Header{Op: opMalloc, ID: 77}
	sent := make(chan error, 1)
	go func() { sent <- srv.ReplyError(req, err) }()
	h, rerr := cli.ReadHeader()
	if rerr != nil {
		t.Fatalf("ReadHeader: %v", rerr)
	}
	if h.Op != opMalloc || h.ID != 77 || h.Flags != FlagReply|FlagError {
		t.Fatalf("error reply header = %+v", h)
	}
	body := make([]byte, h.Len)
	if rerr := cli.ReadBody(body); rerr != nil {
		t.Fatalf("ReadBody: %v", rerr)
	}
	if serr := <-sent; serr != nil {
		t.Fatalf("ReplyError: %v", serr)
	}
	return DecodeError(body)
}

// TestErrorSurvivesHops: node → mediator → tenant, each side wrapping the
// error in its own context, keeps the code and every context's text.
func TestErrorSurvivesHops(t *testing.T) {
	for _, c := range allCodes {
		t.Run(c.code.String(), func(t *testing.T) {
			atNode := fmt.Errorf("node n1 device 0: frame for tenant %q: %w", "acme", c.err)
			atMediator := hop(t, atNode)
			var re *vocab.RemoteError
			if !errors.As(atMediator, &re) || re.Code != c.code || re.Msg != atNode.Error() {
				t.Fatalf("first hop decoded %#v, want RemoteError{%v, %q}", atMediator, c.code, atNode)
			}
			wrapped := fmt.Errorf("malloc 64 MiB: %w", atMediator)
			atTenant := hop(t, wrapped)
			final := fmt.Errorf("client: %w", atTenant)
			if !errors.Is(final, c.err) {
				t.Fatalf("after two hops %q is not %v", final, c.err)
			}
			if vocab.CodeOf(final) != c.code {
				t.Fatalf("after two hops CodeOf = %v, want %v", vocab.CodeOf(final), c.code)
			}
			for _, part := range []string{"client: ", "malloc 64 MiB: ", "node n1 device 0", `"acme"`, c.err.Error()} {
				if !strings.Contains(final.Error(), part) {
					t.Errorf("final message %q lacks %q", final, part)
				}
			}
			// No other sentinel matches (ErrInternal aside, every code is exclusive).
			for _, o := range allCodes {
				if o.code != c.code && errors.Is(final, o.err) {
					t.Errorf("%q also matches %v", final, o.err)
				}
			}
		})
	}
}

func TestUntypedErrorCrossesAsInternal(t *testing.T) {
	got := hop(t, errors.New("disk on fire"))
	if !errors.Is(got, vocab.ErrInternal) || got.Error() != "disk on fire" {
		t.Fatalf("got %#v, want internal %q", got, "disk on fire")
	}
}

func TestReplyErrorNil(t *testing.T) {
	got := hop(t, nil)
	if !errors.Is(got, vocab.ErrInternal) {
		t.Fatalf("ReplyError(nil) decoded as %#v, want internal", got)
	}
}

func TestReplyErrorLongMessage(t *testing.T) {
	for _, msg := range []string{
		strings.Repeat("x", MaxString+100),
		strings.Repeat("x", MaxString-1) + "é" + "tail", // a two-byte rune across the limit
		strings.Repeat("€", MaxString),                  // three-byte runes
		strings.Repeat("y", MaxString),
	} {
		got := hop(t, fmt.Errorf("%s: %w", msg, vocab.ErrQuotaExceeded))
		var re *vocab.RemoteError
		if !errors.As(got, &re) || re.Code != vocab.CodeQuotaExceeded {
			t.Fatalf("decoded %#v, want quota exceeded", got)
		}
		if len(re.Msg) > MaxString || len(re.Msg) < MaxString-3 {
			t.Errorf("message of %d bytes, want at most %d and not much less", len(re.Msg), MaxString)
		}
		if !utf8.ValidString(re.Msg) {
			t.Errorf("message cut inside a rune: ...%q", re.Msg[len(re.Msg)-4:])
		}
		if !strings.HasPrefix(msg+": "+vocab.ErrQuotaExceeded.Error(), re.Msg) {
			t.Errorf("message is not a prefix of the original")
		}
	}
}

// TestReplyErrorManyLines: a message of many lines (a quota file's every
// mistake) too long for one reply keeps whole lines and says how many more
// there were.
func TestReplyErrorManyLines(t *testing.T) {
	var lines []string
	for i := range 300 {
		lines = append(lines, fmt.Sprintf("tenants.toml:%d: tenants.t%d.memory: bad size %q", i+1, i, "lots"))
	}
	got := hop(t, fmt.Errorf("%s: %w", strings.Join(lines, "\n"), vocab.ErrInvalidArgument)).Error()
	if len(got) > MaxString {
		t.Fatalf("message of %d bytes, over %d", len(got), MaxString)
	}
	kept := strings.Split(got, "\n")
	more := kept[len(kept)-1]
	kept = kept[:len(kept)-1]
	var n int
	if _, err := fmt.Sscanf(more, "(%d more lines)", &n); err != nil {
		t.Fatalf("last line %q does not say how many lines were dropped", more)
	}
	if len(kept)+n != len(lines) || len(kept) < 50 {
		t.Fatalf("kept %d lines and dropped %d, of %d", len(kept), n, len(lines))
	}
	for i, l := range kept {
		if l != lines[i] {
			t.Fatalf("line %d is %q, want %q whole", i, l, lines[i])
		}
	}
}

// TestReplyErrorLongInvalidUTF8: a message that is not UTF-8 at all is cut
// near the limit all the same, not emptied.
func TestReplyErrorLongInvalidUTF8(t *testing.T) {
	msg := strings.Repeat("\x80", 2*MaxString)
	got := hop(t, errors.New(msg))
	if n := len(got.Error()); n > MaxString || n < MaxString-utf8.UTFMax {
		t.Fatalf("message of %d bytes, want close to %d", n, MaxString)
	}
}

func TestDecodeError(t *testing.T) {
	enc := func(code uint16, msg string) []byte {
		e := Encoder{}
		e.U16(code)
		e.String(msg)
		return e.B
	}
	for _, c := range allCodes {
		err := DecodeError(enc(uint16(c.code), "m"))
		var re *vocab.RemoteError
		if !errors.As(err, &re) || re.Code != c.code || re.Msg != "m" || !errors.Is(err, c.err) {
			t.Errorf("DecodeError(code %d) = %#v", c.code, err)
		}
	}
	// Unknown codes and OK are protocol errors that still carry the message.
	for _, code := range []uint16{0, uint16(len(allCodes) + 1), 200, 0xffff} {
		err := DecodeError(enc(code, "the text"))
		var re *vocab.RemoteError
		if !errors.As(err, &re) || re.Code != vocab.CodeProtocol || !errors.Is(err, vocab.ErrProtocol) {
			t.Errorf("DecodeError(code %d) = %#v, want a protocol RemoteError", code, err)
			continue
		}
		if !strings.Contains(re.Msg, "the text") || !strings.Contains(re.Msg, fmt.Sprint(code)) {
			t.Errorf("DecodeError(code %d) message %q lacks the code or the text", code, re.Msg)
		}
	}
	// Malformed bodies are protocol errors, not remote errors.
	long := enc(1, strings.Repeat("z", MaxString+1))
	for name, body := range map[string][]byte{
		"empty":       nil,
		"short code":  {1},
		"no string":   {1, 0},
		"short len":   {1, 0, 5, 0},
		"short text":  enc(1, "hello")[:8],
		"trailing":    append(enc(1, "hello"), 0),
		"over limit":  long,
		"huge length": {1, 0, 0xff, 0xff, 0xff, 0xff},
	} {
		err := DecodeError(body)
		var re *vocab.RemoteError
		if !errors.Is(err, vocab.ErrProtocol) || errors.As(err, &re) {
			t.Errorf("DecodeError(%s) = %#v, want a plain protocol error", name, err)
		}
	}
}
