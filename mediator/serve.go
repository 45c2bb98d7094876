package mediator

// Serving a connection to one of the mediator's sockets: the handshake,
// which decides the peer's role, and the operator requests. A tenant's
// connection becomes a session (session.go).

import (
	"fmt"
	"net"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// serveConn serves one connection; greeted is called once its hello has
// been read, or has failed.
func (m *Mediator) serveConn(nc net.Conn, ctr *container, greeted func()) {
	var c *wire.Conn
	if uc, ok := nc.(*net.UnixConn); ok { // tenants pass host memory as memfds
		c = wire.NewConnFDs(withReplyTimeout(nc), uc)
	} else {
		c = wire.NewConn(withReplyTimeout(nc))
	}
	if m.cfg.Requests != nil {
		c.Observe(m.cfg.Requests)
	}
	defer c.Close()
	log := m.log.WithField("conn", fmt.Sprintf("%p", nc))
	h, hello, err := api.ReadHello(c, time.Now().Add(HandshakeTimeout), "mediator")
	greeted()
	if err != nil {
		log.WithError(err).Info("handshake refused")
		if h.Op != 0 {
			_ = c.ReplyError(h, err)
		}
		return
	}
	switch {
	case hello.Role == api.RoleOperator && ctr == nil:
		m.serveOperator(c, h, privileged(nc))
	case hello.Role == api.RoleOperator: // a container reading its own view (self.go)
		if err := ctr.admitPeer(nc); err != nil {
			log.WithError(err).Warn("connection to a container's socket from outside it")
			_ = c.ReplyError(h, err)
			return
		}
		m.serveSelf(c, h, ctr)
	case hello.Role == api.RoleTenant:
		if ctr != nil {
			if err := ctr.admitPeer(nc); err != nil {
				log.WithError(err).Warn("connection to a container's socket from outside it")
				_ = c.ReplyError(h, err)
				return
			}
		}
		var s *session
		if hello.Resume != "" {
			s, err = m.resume(c, hello, ctr)
		} else {
			s, err = m.newSession(c, hello, ctr)
		}
		if err != nil {
			log.WithError(err).WithField("tenant", hello.Tenant).Info("session refused")
			_ = c.ReplyError(h, err)
			return
		}
		s.run(h)
	default:
		_ = c.ReplyError(h, fmt.Errorf("role %d may not connect to this socket: %w", hello.Role, api.ErrPermissionDenied))
	}
}

// serveOperator answers operator requests. Those that change state
// (register, release, reload) need a privileged peer; what an unprivileged
// one may ask (status, tenants, the catalog) has no body, and its status
// and tenants requests are paced per uid (statuspace.go).
func (m *Mediator) serveOperator(c *wire.Conn, hello wire.Header, priv bool) {
	serveRequests(c, hello, priv, "an unprivileged peer", func(op wire.Op, body []byte) ([]byte, error) {
		if (op == api.OpStatus || op == api.OpTenants) && !priv {
			if err := m.statusPace.of(c.NetConn()).wait(m.stop); err != nil {
				return nil, err
			}
		}
		return m.operate(op, body, priv)
	})
}

// serveRequests answers the hello, then each request with answer, one at a
// time, until the peer hangs up or a reply cannot be written. Unless
// bodies, a request with a body is refused unread (nothing is read or
// allocated for one), naming the peer as who, and the connection closed.
func serveRequests(c *wire.Conn, hello wire.Header, bodies bool, who string, answer func(op wire.Op, body []byte) ([]byte, error)) {
	if err := c.Reply(hello, api.Encode(&api.HelloReply{Version: api.Version})); err != nil {
		return
	}
	for {
		h, err := c.ReadHeader()
		if err != nil {
			return
		}
		if !bodies && h.Len > 0 {
			_ = c.ReplyError(h, fmt.Errorf("%v with a %d-byte body from %s: its requests have none: %w", h.Op, h.Len, who, api.ErrPermissionDenied))
			return
		}
		body := make([]byte, h.Len)
		if err := c.ReadBody(body); err != nil {
			return
		}
		reply, err := answer(h.Op, body)
		if err != nil {
			err = c.ReplyError(h, err)
		} else {
			err = c.Reply(h, reply)
		}
		if err != nil {
			return
		}
	}
}

func (m *Mediator) operate(op wire.Op, body []byte, priv bool) ([]byte, error) {
	switch op {
	case api.OpStatus:
		return m.statusJSON()
	case api.OpKernels:
		return m.catalogBody(), nil
	case api.OpTenants:
		return m.tenantsJSON()
	case api.OpRegister, api.OpRelease, api.OpReload:
		if !priv {
			return nil, fmt.Errorf("%v needs a peer running as root or as the mediator's user: %w", op, api.ErrPermissionDenied)
		}
	default:
		return nil, fmt.Errorf("%v is not an operator operation: %w", op, api.ErrPermissionDenied)
	}
	switch op {
	case api.OpRegister:
		var r api.Register
		if err := api.Decode(body, &r); err != nil {
			return nil, fmt.Errorf("register: %w", err)
		}
		reply, err := m.Register(r)
		if err != nil {
			return nil, err
		}
		return api.Encode(reply), nil
	case api.OpRelease:
		var r api.Release
		if err := api.Decode(body, &r); err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		return nil, m.Release(r.Namespace, r.Container)
	default: // OpReload
		return nil, m.Reload()
	}
}

func (m *Mediator) catalogBody() []byte {
	list := api.KernelList{}
	for _, k := range m.catalog {
		list.Kernels = append(list.Kernels, k)
	}
	sortKernels(list.Kernels)
	return api.Encode(&list)
}
