package mediator

import (
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/isolation"
)

// admitHost checks that the process on the other end of a host-socket
// connection may act as tenant, under the quota file in force now
// (isolation.Config.AdmitHost): a reload applies to the sessions opened
// after it.
func (m *Mediator) admitHost(nc net.Conn, tenant string) error {
	cfg := m.admission.Config()
	if cfg.Host.Open {
		return nil // whoever the peer is, credentials or none
	}
	p, err := hostPeer(nc)
	if err != nil {
		return fmt.Errorf("tenant %q on the host socket: peer credentials: %v: %w", tenant, err, api.ErrPermissionDenied)
	}
	return cfg.AdmitHost(p, tenant)
}

// hostPeer is the process on the other end of a host-socket connection: its
// uid and effective gid (SO_PEERCRED) and its supplementary groups
// (SO_PEERGROUPS), all as the kernel recorded them at connect, so that
// neither the peer's later set*id calls nor a reuse of its pid change what
// is checked. Where the kernel cannot tell the groups, the peer has only
// its effective gid, which maps it to no more tenants than it has.
func hostPeer(nc net.Conn) (isolation.Peer, error) {
	if rc, ok := nc.(*replyConn); ok {
		nc = rc.Conn // a tenant's connection, wrapped for its reply timeout (limits.go)
	}
	cred, err := peerCred(nc)
	if err != nil {
		return isolation.Peer{}, err
	}
	p := isolation.Peer{UID: cred.Uid, GIDs: []uint32{cred.Gid}, Operator: operator(cred.Uid)}
	if groups, err := peerGroups(nc.(*net.UnixConn)); err == nil { // peerCred took only a UnixConn
		for _, g := range groups {
			if !slices.Contains(p.GIDs, g) {
				p.GIDs = append(p.GIDs, g)
			}
		}
	}
	return p, nil
}

// operator reports whether uid is root's or the mediator's own: such a peer
// may change state (register, release, reload) and act as any tenant.
func operator(uid uint32) bool {
	return uid == 0 || int(uid) == os.Getuid()
}

// warnIfOpen says, at start and at each reload, that cfg lets every local
// user act as every tenant on the host socket.
func warnIfOpen(log logrus.FieldLogger, cfg *isolation.Config) {
	if cfg.Host.Open {
		log.WithField("file", cfg.Path).Warn(`host socket open: any local user may act as any tenant (no quota file, or [host] access = "open"); map users to tenants in the quota file's [host] table on a shared host`)
	}
}
