package mediator

import (
	"net"
	"os"

	"github.com/sirupsen/logrus"
)

// A live upgrade (cmd/vgpu-mediator, internal/upgrade) passes the
// listening sockets from one mediator process to the next: the old one
// hands over with HandoverSockets, which leaves every container's socket
// bound at its path, and the new one gets them as Config.Inherited. So a
// container's socket is never missing or unbound, and a tenant connecting
// during the upgrade waits in its backlog until the new mediator, having
// restored the registrations and the sessions, accepts.

// HandoverSockets hands over as Handover does, but leaves every
// container's socket bound at its path and returns a descriptor of each,
// by path, for the successor; the caller closes them. A socket whose
// descriptor cannot be had is closed as at a stop, and logged: the
// successor binds it again as it restores its registration.
func (m *Mediator) HandoverSockets() (map[string]*os.File, error) {
	if m.jr != nil {
		m.jr.handover.Store(true)
	}
	pass := map[string]*os.File{}
	err := m.close(pass)
	return pass, err
}

// passSocket puts a descriptor of c's socket in pass and stops accepting on
// it, leaving it bound and its directory in place; false if it could not.
func (c *container) passSocket(pass map[string]*os.File, log logrus.FieldLogger) bool {
	f, err := c.listener.(*net.UnixListener).File()
	if err != nil {
		log.WithError(err).WithField("socket", c.socket).Warn("container socket not passed to the successor: it is closed, and bound again as its registration is restored")
		return false
	}
	pass[c.socket] = f
	c.listener.Close() // bound through /proc/self/fd, it unlinks nothing (listenIn)
	c.dir.Close()
	return true
}

// inherited returns, for a restored registration, the socket a predecessor
// passed at path, if any (Config.Inherited), and takes it out of the
// config.
func (m *Mediator) inherited(path string, restored bool) (net.Listener, bool) {
	l, ok := m.cfg.Inherited[path]
	if !restored || !ok {
		return nil, false
	}
	delete(m.cfg.Inherited, path)
	return l, true
}

// serveRestored serves the sockets of the containers New restored, now
// that their sessions are restored too, and closes the inherited sockets
// that no restored registration took (their containers are gone; restore
// removed what they left at their paths).
func (m *Mediator) serveRestored() {
	for _, ctr := range m.restoring {
		m.wg.Add(1)
		m.serveContainer(ctr)
	}
	m.restoring = nil
	for path, l := range m.cfg.Inherited {
		m.log.WithField("socket", path).Info("a socket passed by the previous mediator is no registration's now: closed")
		l.Close()
	}
	m.cfg.Inherited = nil
}
