package accelerator

import (
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/vgpu/vgpu/api/wire"
)

// MaxPushBacklog bounds the pushes (invalidations, revocations) waiting to
// be written to one connection. They wait only while its socket is full,
// each for a write of a page its mediator leased or a revocation of an
// object it imported, so only a mediator that has stopped reading leaves
// this many; the next push ends its connection (pusher).
const MaxPushBacklog = 1024

// pusher writes a connection's pushes, in order, on a goroutine of its
// own, so that whoever pushes (a write waiting to be applied, a
// revocation) never waits for the peer to read. A mediator that stops
// reading thus holds up a write until its lease runs out and a revocation
// for a lease, as one that does not answer does (shared.go), and nothing
// else.
//
// A push is never dropped while the connection stays open: one that finds
// MaxPushBacklog waiting ends the connection instead. A mediator that
// missed a revocation would go on serving the object from its cache; one
// whose connection ended refuses every shared range reached through it,
// and the node forgets the connection as a reader and importer.
type pusher struct {
	c     *wire.Conn
	log   logrus.FieldLogger
	queue chan push
	done  chan struct{} // closed once the connection has ended
	end   sync.Once
}

type push struct {
	op   wire.Op
	body []byte
}

// startPusher starts the pusher of c; stop it once c has ended.
func startPusher(c *wire.Conn, log logrus.FieldLogger) *pusher {
	p := &pusher{c: c, log: log, queue: make(chan push, MaxPushBacklog), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *pusher) run() {
	for {
		select {
		case m := <-p.queue:
			if err := p.c.Push(m.op, m.body); err != nil {
				p.c.Close() // the pushes behind it would be lost
				return
			}
		case <-p.done:
			return
		}
	}
}

// push queues a push of op with body, which nobody may modify afterwards.
// It never blocks.
func (p *pusher) push(op wire.Op, body []byte) {
	select {
	case p.queue <- push{op, body}:
	default:
		p.end.Do(func() {
			p.log.WithField("pushes", MaxPushBacklog).Info("mediator reads no pushes: connection dropped")
			// On a goroutine of its own: closing a TLS connection first
			// tries to tell the peer, which does not read.
			go p.c.Close()
		})
	}
}

// stop ends the pusher; the pushes still queued are not sent.
func (p *pusher) stop() { close(p.done) }
