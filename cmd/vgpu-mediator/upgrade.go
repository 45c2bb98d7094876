package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/upgrade"
	"github.com/vgpu/vgpu/mediator"
)

// upgrader answers vgpuctl upgrade on the control socket (internal/upgrade
// has the protocol): it starts the new binary with this process's
// arguments, hands over to it with the listening sockets, and stops.
type upgrader struct {
	o    *options
	m    *mediator.Mediator
	host *net.UnixListener // the host socket
	ctl  net.Listener      // the control socket
	// stopServices closes the status page and the metrics server, whose
	// ports the successor listens on.
	stopServices func()
	// leaveCluster closes the etcd session (revoking its lease) in
	// cluster mode: the successor registers under the same --cluster-id,
	// which it waits for while the lease lives.
	leaveCluster func()
	log          logrus.FieldLogger
	// orphaned: an upgrade handed over and no successor took over, so
	// nothing serves; the process exits 1.
	orphaned atomic.Bool
}

// do runs one upgrade; it reports whether this process has handed over
// (and must stop once the report is written).
func (u *upgrader) do(req upgrade.Request) (upgrade.Report, bool) {
	rep := upgrade.Report{OldPid: os.Getpid(), Binary: req.Binary}
	if rep.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			rep.Error = fmt.Sprintf("this mediator's executable: %v", err)
			return rep, false
		}
		rep.Binary = exe
	}
	switch {
	case u.o.stateDir == "":
		rep.Error = "no --state-dir: the sessions and registrations would not survive the upgrade; start the mediator with one"
		return rep, false
	case len(u.o.nodes) == 0 && !u.o.etcd.Enabled():
		rep.Error = "the mediator embeds its node (no --node): the node, and every session's device memory, would end with this process; run vgpu-node and point --node at it"
		return rep, false
	}
	timeout := cmp.Or(req.Timeout, upgrade.DefaultTimeout)
	log := u.log.WithFields(logrus.Fields{"binary": rep.Binary, "timeout": timeout.String()})
	host, err := u.host.File() // stays bound while this process hands over
	if err != nil {
		rep.Error = fmt.Sprintf("host socket: %v", err)
		return rep, false
	}
	log.Info("upgrade: starting the new binary")
	s, err := upgrade.Start(rep.Binary, os.Args[1:], timeout)
	if err != nil {
		host.Close()
		log.WithError(err).Warn("upgrade failed; this mediator serves on")
		rep.Error = err.Error()
		return rep, false
	}
	log.WithField("pid", s.Pid()).Info("upgrade: the new binary took over; handing over to it")
	u.host.SetUnlinkOnClose(false)
	sockets, err := u.m.HandoverSockets()
	if err != nil {
		log.WithError(err).Warn("handing over")
	}
	sockets[u.o.socket] = host
	u.ctl.Close() // the successor binds its own
	u.stopServices()
	u.leaveCluster()
	defer func() {
		for _, f := range sockets {
			f.Close()
		}
	}()
	rep.NewPid = s.Pid()
	if err := s.Pass(sockets, timeout); err != nil {
		// Handed over already: this process cannot serve again, but its
		// own binary can, restoring as the new one would have.
		log.WithError(err).Error("upgrade failed after the handover; starting this mediator's own binary again")
		rep.Error, rep.NewPid = err.Error(), 0
		back, err := upgrade.Start("/proc/self/exe", os.Args[1:], timeout)
		if err == nil {
			err = back.Pass(sockets, timeout)
		}
		if err != nil {
			rep.Error += fmt.Sprintf("; starting the previous binary again failed too (%v): nothing serves; the state is kept in %s for the next vgpu-mediator", err, u.o.stateDir)
			log.WithError(err).Error("rolling back failed")
			u.orphaned.Store(true)
			return rep, true
		}
		rep.NewPid, rep.RolledBack = back.Pid(), true
		rep.Error += fmt.Sprintf("; rolled back: the previous binary serves again, as pid %d", back.Pid())
	}
	log.WithField("pid", rep.NewPid).Info("upgrade: the successor serves; stopping")
	sdNotify(log, fmt.Sprintf("MAINPID=%d", rep.NewPid))
	return rep, true
}

// serveUpgrades answers vgpuctl upgrade until this process hands over,
// then stops it as SIGTERM does (everything is closed already), or until
// a stop closes the control socket.
func (u *upgrader) serveUpgrades() {
	handedOver := false
	upgrade.ServeControl(u.ctl, func(req upgrade.Request) (upgrade.Report, bool) {
		rep, done := u.do(req)
		handedOver = done
		return rep, done
	})
	if handedOver {
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}

// takeOver takes the listening sockets from the mediator that started this
// one (pred), once it has handed over: the host socket's listener, and the
// containers' for cfg.Inherited.
func takeOver(pred *upgrade.Predecessor, cfg *mediator.Config, socket string) (*net.UnixListener, error) {
	files, err := pred.Take()
	if err != nil {
		return nil, err
	}
	var host *net.UnixListener
	cfg.Inherited = map[string]net.Listener{}
	for path, f := range files {
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("socket %s passed by the previous mediator: %v: %w", path, err, api.ErrInternal)
		}
		if path == socket {
			host = l.(*net.UnixListener)
			host.SetUnlinkOnClose(true) // a stop removes it, as it removes a socket it bound
		} else {
			cfg.Inherited[path] = l
		}
	}
	if host == nil {
		return nil, fmt.Errorf("the previous mediator passed no socket %s (--socket): %w", socket, api.ErrInvalidArgument)
	}
	return host, nil
}

// sdNotify sends state to systemd when it runs this process as a
// Type=notify service; otherwise it does nothing.
func sdNotify(log logrus.FieldLogger, state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	c, err := net.Dial("unixgram", addr)
	if err == nil {
		_, err = c.Write([]byte(state))
		c.Close()
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.WithError(err).WithField("state", state).Warn("telling systemd")
	}
}
