package accelerator

// Reattach: a mediator that restarts (a crash, a kill, an upgrade) must not
// take its tenants' device memory with it. A connection that attached
// (OpNodeAttach with Owner 0) gives the node a secret token; when such a
// connection drops, the node keeps its frames, sealed state and tenant
// accounting for the reattach grace, parked under its owner id, instead
// of scrubbing and freeing them at once. A later connection of the same
// tenant that presents the owner id and the token (OpNodeAttach with the
// Owner) takes them over: it becomes that owner, and the node answers
// with the frames it holds. Once the grace has passed with no reclaim,
// the frames are scrubbed and freed as for any connection that ended. An
// attach may ask for a shorter grace than the node's (GraceMillis): a
// mediator with no journal asks only for long enough to outlast a network
// blip, since nothing would reclaim its frames after its own restart.
//
// Invariants:
//   - A parked owner is in Node.parked exactly until it is reclaimed or
//     released; whoever takes it out of the map (a reclaim, the expiry's
//     timer, Close) alone acts on it, so it is released at most once and
//     never both released and reclaimed.
//   - A parked owner stays joined to its tenant (limits.go), so its
//     tenant's weight and cap, and the frames it holds against the
//     device, count as before while it waits.
//   - A parked connection's shared objects live on: they are its frames,
//     their grants stay, and importers read and write them meanwhile. A
//     reclaim makes the reclaimer their exporter (objectTable.adopt); an
//     expiry ends them with the frames, telling the importers, as any
//     free does. What the connection imported or pinned, and where its
//     invalidations went, is forgotten when it drops, before it is
//     parked, so that a reclaimer, which takes the same cache id (the
//     owner), starts with no import or pin a late forget could drop. Its
//     leases are not forgotten: the node cannot tell a dead mediator from
//     one cut off that still serves its copies, so a write waits each one
//     out (a lease at most), and no copy read before the drop is served
//     after a write is acknowledged. Its graphs end with it: only frames
//     and exports are kept.
//   - Only a connection that holds nothing yet (no frames) may reclaim,
//     and only for its own tenant; a wrong token is refused with
//     api.ErrPermissionDenied and the parked frames stay parked.

import (
	"crypto/subtle"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// DefaultReattachGrace is how long a node keeps an attached connection's
// frames after it dropped (SetReattachGrace).
const DefaultReattachGrace = 60 * time.Second

// minToken is the shortest token a connection may attach with: 128 bits
// in hex.
const minToken = 32

// parkedConn is a dropped connection whose frames wait for a reclaim.
type parkedConn struct {
	c     *conn // ended: its reader and executor are done
	timer *time.Timer
	since time.Time
	grace time.Duration // how long it is kept: the node's, or the shorter one asked
}

// SetReattachGrace sets how long the frames of an attached connection that
// dropped are kept for a reclaim; 0 frees them at once, as for any other
// connection. Set before Serve.
func (n *Node) SetReattachGrace(d time.Duration) {
	n.mu.Lock()
	n.grace = d
	n.mu.Unlock()
}

// Expired counts the parked connections whose grace ended without a
// reclaim, their frames scrubbed and freed.
func (n *Node) Expired() uint64 { return n.expired.Load() }

// attach answers OpNodeAttach.
func (c *conn) attach(h wire.Header, body []byte) error {
	var m api.NodeAttach
	if err := decode(h.Op, body, &m); err != nil {
		return err
	}
	if len(m.Token) < minToken {
		return fmt.Errorf("attach: token of %d bytes, want at least %d: %w", len(m.Token), minToken, api.ErrInvalidArgument)
	}
	if m.HasGrace && m.GraceMillis == 0 {
		return fmt.Errorf("attach: a grace of 0 ms asked, which would keep nothing: %w", api.ErrInvalidArgument)
	}
	grace := time.Duration(m.GraceMillis) * time.Millisecond
	if m.Owner == 0 {
		c.node.mu.Lock()
		c.token, c.grace = m.Token, grace
		c.node.attached[c.owner] = c
		c.node.mu.Unlock()
		return c.c.Reply(h, api.Encode(&api.NodeAttached{Owner: uint64(c.owner)}))
	}
	reply, err := c.reclaim(owner(m.Owner), m.Token)
	if err != nil {
		return err
	}
	c.grace = grace
	return c.c.Reply(h, api.Encode(reply))
}

// reclaim makes c the parked connection o, whose token must be token:
// c takes its owner id, and with it its frames and its place in its
// tenant's accounting.
func (c *conn) reclaim(o owner, token string) (*api.NodeAttached, error) {
	n := c.node
	for _, d := range n.devs {
		if len(d.frames.ownedBy(c.owner)) > 0 {
			return nil, fmt.Errorf("reclaim of connection %d: this connection holds frames already: %w", o, api.ErrInvalidArgument)
		}
	}
	n.mu.Lock()
	p, err := n.waitParked(o)
	switch {
	case err != nil:
		n.mu.Unlock()
		return nil, err
	case p == nil:
		n.mu.Unlock()
		return nil, fmt.Errorf("reclaim of connection %d: the node keeps nothing of it (never attached, reclaimed already, or its %v grace ended (or a shorter one it asked) and its frames were freed): %w",
			o, n.grace, api.ErrUnavailable)
	case p.c.tenant != c.tenant:
		n.mu.Unlock()
		return nil, fmt.Errorf("reclaim of connection %d of tenant %q by tenant %q: %w", o, p.c.tenant, c.tenant, api.ErrPermissionDenied)
	case subtle.ConstantTimeCompare([]byte(p.c.token), []byte(token)) != 1:
		n.mu.Unlock()
		return nil, fmt.Errorf("reclaim of connection %d: the token does not match the one it attached with: %w", o, api.ErrPermissionDenied)
	}
	delete(n.parked, o)
	p.timer.Stop() // its callback, if it runs, finds nothing parked
	delete(n.attached, c.owner)
	n.attached[o] = c // as o, c is attached with o's token from here on
	n.mu.Unlock()
	// Out of the parked map, p.c is no one's to release: its objects are
	// c's from here on, before c's next request can free their frames.
	objects := n.objects.adopt(p.c, c)
	// c's own owner id held nothing: it leaves the tenant, and c goes on
	// as o, which never left it.
	n.leaveTenant(c.tenant, c.owner)
	c.owner, c.token, c.share.limits = o, token, p.c.share.limits
	c.log = c.log.WithField("reclaimed", uint64(o))
	reply := &api.NodeAttached{Owner: uint64(o)}
	held := 0
	for i, d := range n.devs {
		fs := d.frames.ownedBy(o)
		held += len(fs)
		reply.Devices = append(reply.Devices, api.NodeFrames{Device: uint32(i), Frames: fs})
	}
	c.log.WithFields(logrus.Fields{"frames": held, "objects": objects, "parked_for": time.Since(p.since).Round(time.Millisecond).String()}).
		Info("mediator reclaimed the frames of its dropped connection")
	return reply, nil
}

// reclaimWait bounds how long a reclaim waits for a connection that
// attached and is still live to drop: a mediator restarted right after a
// crash can reach the node before the node has read its predecessor's
// end of stream.
const reclaimWait = 10 * time.Second

// waitParked returns what is parked as o. If o is a live connection that
// attached, it waits for it to drop and be parked, at most reclaimWait.
// Called and returns with n.mu held.
func (n *Node) waitParked(o owner) (*parkedConn, error) {
	deadline := time.NewTimer(reclaimWait)
	defer deadline.Stop()
	for n.parked[o] == nil && n.attached[o] != nil && !n.closed {
		note := n.parkedNote
		n.mu.Unlock()
		select {
		case <-note:
		case <-deadline.C:
			n.mu.Lock()
			return nil, fmt.Errorf("reclaim of connection %d: it is still connected after %v: %w", o, reclaimWait, api.ErrUnavailable)
		}
		n.mu.Lock()
	}
	return n.parked[o], nil
}

// end releases what an ended connection held, or parks it for the
// reattach grace if it attached.
func (c *conn) end() {
	n := c.node
	// Before it can be parked, and so reclaimed: a forget after the
	// reclaim would drop the reclaimer's reads and pins, which go under
	// the same cache id.
	n.objects.forget(c)
	n.mu.Lock()
	if n.attached[c.owner] == c {
		delete(n.attached, c.owner)
	}
	grace := n.grace
	if c.grace > 0 {
		grace = min(grace, c.grace)
	}
	if c.token == "" || grace <= 0 || n.closed {
		// A reclaim waiting for this connection finds nothing parked.
		close(n.parkedNote)
		n.parkedNote = make(chan struct{})
		n.mu.Unlock()
		c.releaseAll()
		return
	}
	o := c.owner
	p := &parkedConn{c: c, since: time.Now(), grace: grace}
	p.timer = time.AfterFunc(grace, func() { n.expire(o, p) })
	n.parked[o] = p
	close(n.parkedNote)
	n.parkedNote = make(chan struct{})
	n.mu.Unlock()
	c.log.WithField("grace", grace.String()).Info("mediator connection dropped: its frames are kept for a reclaim")
}

// expire releases p, parked as o, if it is still parked.
func (n *Node) expire(o owner, p *parkedConn) {
	n.mu.Lock()
	if n.parked[o] != p || n.closed {
		n.mu.Unlock()
		return
	}
	delete(n.parked, o)
	n.wg.Add(1) // Close waits for the release
	n.mu.Unlock()
	defer n.wg.Done()
	p.c.releaseAll()
	n.expired.Add(1)
	p.c.log.WithField("grace", p.grace.String()).Info("reattach grace ended with no reclaim: frames scrubbed and freed")
}

// releaseParked releases every parked connection; Close calls it once no
// more can be parked.
func (n *Node) releaseParked() {
	n.mu.Lock()
	ps := n.parked
	n.parked = map[owner]*parkedConn{}
	n.mu.Unlock()
	for _, p := range ps {
		p.timer.Stop()
		p.c.releaseAll()
	}
}
