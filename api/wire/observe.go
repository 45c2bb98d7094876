package wire

import (
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// ReplyObserver is told of each reply a Conn sends to a request it read:
// the request's operation, the time from reading its header to writing the
// reply, and the reply's code (CodeOK for a success). It runs on the
// replying goroutine, on every request's path, so it must be cheap and
// must not block (a metrics histogram and counter).
type ReplyObserver interface {
	Replied(op Op, took time.Duration, code vocab.Code)
}

// Observe makes c tell o of each reply to a request read from now on. Call
// it before c's first read; a Conn without an observer reads no clock.
func (c *Conn) Observe(o ReplyObserver) { c.obs = o }

// epoch is the origin of monotonic: time.Since reads the monotonic clock,
// so a wall-clock step never makes a request's time negative.
var epoch = time.Now()

// monotonic is nanoseconds since epoch, never 0 (0 marks a header read
// without an observer).
func monotonic() int64 { return int64(time.Since(epoch)) | 1 }

// observe tells c's observer of a reply to h with code, where h was read
// by a Conn with an observer.
func (c *Conn) observe(h Header, code vocab.Code) {
	if c.obs == nil || h.read == 0 {
		return
	}
	c.obs.Replied(h.Op, time.Duration(monotonic()-h.read), code)
}
