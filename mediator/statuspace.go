package mediator

import (
	"net"
	"sync"
)

// Status for whoever reaches the host socket: OpStatus asks every node for
// its status, and etcd in cluster mode, as OpTenants asks etcd; any local
// user may ask them (docs/security.md), on as many as MaxHostConnsPerUID
// connections. Unpaced, 8 connections of one peer had the node answer
// 11 865 status requests in a second. So the status and tenants requests
// of a peer that is not an operator are answered SelfInterval apart per
// uid, over all its connections; an operator's (root, the mediator's user:
// vgpuctl as root, the status page) are not paced.

// uidPaces holds a pace per peer uid. Its zero value is ready. It grows by
// one entry per uid that asks, and only the host's accounts can connect
// (a peer without credentials counts as unknownUID).
type uidPaces struct {
	mu sync.Mutex
	by map[uint32]*pace // guarded by mu
}

// of is the pace of nc's peer.
func (u *uidPaces) of(nc net.Conn) *pace {
	uid := uint32(unknownUID)
	if rc, ok := nc.(*replyConn); ok {
		nc = rc.Conn
	}
	if cred, err := peerCred(nc); err == nil {
		uid = cred.Uid
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.by == nil {
		u.by = map[uint32]*pace{}
	}
	p := u.by[uid]
	if p == nil {
		p = &pace{}
		u.by[uid] = p
	}
	return p
}
