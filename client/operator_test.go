package client

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// silentMediator listens at a new socket and, on each connection, answers
// the hello if hello is set and then nothing more, as a wedged mediator.
func silentMediator(t *testing.T, hello bool) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "m.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				c := wire.NewConn(nc)
				for answer := hello; ; answer = false {
					h, err := c.ReadHeader()
					if err != nil || c.ReadBody(make([]byte, h.Len)) != nil {
						return
					}
					if answer && c.Reply(h, api.Encode(&api.HelloReply{Version: api.Version})) != nil {
						return
					}
				}
			}()
		}
	}()
	return socket
}

// TestOperatorCallsTimeOut: a mediator that does not answer the hello, or
// a later call, fails it after the operator's timeout with
// api.ErrUnavailable, naming the mediator, the call and the timeout.
func TestOperatorCallsTimeOut(t *testing.T) {
	const timeout = 200 * time.Millisecond
	check := func(t *testing.T, err error, took time.Duration, socket, op string) {
		t.Helper()
		if !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("%v, want api.ErrUnavailable", err)
		}
		for _, w := range []string{socket, "did not answer " + op + " within " + timeout.String()} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q does not say %q", err, w)
			}
		}
		if took < timeout || took > timeout+5*time.Second {
			t.Errorf("failed after %v, want the %v timeout", took, timeout)
		}
	}
	t.Run("hello", func(t *testing.T) {
		socket := silentMediator(t, false)
		start := time.Now()
		_, err := DialOperatorTimeout(socket, timeout)
		check(t, err, time.Since(start), socket, "hello")
	})
	t.Run("reload", func(t *testing.T) {
		socket := silentMediator(t, true)
		op, err := DialOperatorTimeout(socket, timeout)
		if err != nil {
			t.Fatal(err)
		}
		defer op.Close()
		start := time.Now()
		err = op.Reload()
		check(t, err, time.Since(start), socket, "reload")
		// The connection is closed: a late reply cannot answer this call.
		if _, err := op.Tenants(); !errors.Is(err, api.ErrUnavailable) {
			t.Errorf("call after a timeout: %v, want api.ErrUnavailable", err)
		}
	})
	if _, err := DialOperatorTimeout(silentMediator(t, true), 0); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "0s") {
		t.Errorf("timeout 0: %v, want api.ErrInvalidArgument naming it", err)
	}
}
