package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
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
//
// It also orders the process's signals with an upgrade (or a SIGUSR2
// handover, handover.go): a stop (SIGTERM, SIGINT) or a reload (SIGHUP)
// that arrives while one runs waits for it to end — the handover done and
// the successor serving, or rolled back from — and then goes to whichever
// process serves: this one if the upgrade failed before it handed over,
// else the successor, which gets the same signal. So a stop during an
// upgrade ends with nothing serving, as any stop does, and never with
// both processes serving or with the upgrade cut short half done (this
// one gone while its successor restores, with no one to roll back); a
// reload reaches the process that serves, whichever read the quota file
// first. No upgrade starts once a stop has begun, nor after a handover.
type upgrader struct {
	o    *options
	m    *mediator.Mediator
	host *net.UnixListener // the host socket
	ctl  net.Listener      // the control socket; nil if it could not be made
	// stopServices closes the status page and the metrics server, whose
	// ports the successor listens on.
	stopServices func()
	// leaveCluster closes the etcd session (revoking its lease) in
	// cluster mode: the successor registers under the same --cluster-id,
	// which it waits for while the lease lives.
	leaveCluster func()
	// stopSelf ends the signal loop (daemon.Signals.Stop) once this
	// process handed over.
	stopSelf func()
	log      logrus.FieldLogger
	// orphaned: an upgrade handed over and no successor took over, so
	// nothing serves; the process exits 1.
	orphaned atomic.Bool
	// served is closed when the control socket is served no more (its
	// last report written); nil without one.
	served chan struct{}

	mu sync.Mutex
	// busy is closed when the upgrade or handover in progress ends; nil
	// while none runs. Guarded by mu.
	busy chan struct{}
	// handedOver says this process serves no more; successor is the pid
	// that serves in its place (0: none, after a SIGUSR2 handover or a
	// failed roll back). Guarded by mu.
	handedOver bool
	successor  int
	stopping   bool // a stop began: no upgrade starts; guarded by mu
	// passing counts the reloads between their start and the moment they
	// know where their SIGHUP goes (here, or sent on to the successor):
	// stop waits for them, so that a reload that waited for the upgrade
	// reaches the successor before this process exits. Guarded by mu;
	// passed is signalled (with mu) when it falls.
	passing int
	passed  *sync.Cond
}

// begin starts an upgrade or a handover, or says why none may start.
func (u *upgrader) begin() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.stopping:
		return errors.New("the mediator is stopping")
	case u.handedOver:
		return errors.New("the mediator handed over already")
	case u.busy != nil:
		return errors.New("an upgrade is in progress")
	}
	u.busy = make(chan struct{})
	return nil
}

// end ends the upgrade or handover begin started: handedOver says this
// process serves no more, successor the pid that serves in its place.
func (u *upgrader) end(handedOver bool, successor int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handedOver, u.successor = handedOver, successor
	close(u.busy)
	u.busy = nil
}

// settle waits for the upgrade or handover in progress, if any, to end,
// and returns the pid of the successor that serves in this process's
// place (0: this one serves, or nothing does) and whether this one still
// serves.
func (u *upgrader) settle(why string) (successor int, serving bool) {
	u.mu.Lock()
	if busy := u.busy; busy != nil {
		u.mu.Unlock()
		u.log.WithField("signal", why).Info("an upgrade is in progress: the signal waits for it to end, and goes to whichever process serves then")
		<-busy
		u.mu.Lock()
	}
	defer u.mu.Unlock()
	return u.successor, !u.handedOver
}

// reload answers SIGHUP: it reloads this mediator, or passes the signal
// to the successor that serves in its place.
func (u *upgrader) reload() error {
	u.mu.Lock()
	u.passing++
	u.mu.Unlock()
	successor, serving, err := u.passReload()
	u.mu.Lock()
	u.passing--
	u.passingCond().Broadcast()
	u.mu.Unlock()
	if serving {
		return u.m.Reload() // not waited for by stop: it may hang on the quota file
	}
	if err == nil && successor == 0 {
		err = errors.New("handed over, and no successor serves: nothing to reload")
	}
	return err
}

// passReload waits for the upgrade in progress and sends the SIGHUP on to
// the successor that serves in this process's place, if one does.
func (u *upgrader) passReload() (successor int, serving bool, err error) {
	successor, serving = u.settle("SIGHUP")
	if serving || successor == 0 {
		return successor, serving, nil
	}
	u.log.WithField("pid", successor).Info("SIGHUP: passed on to the mediator that took over")
	return successor, false, syscall.Kill(successor, syscall.SIGHUP)
}

// passingCond is the condition passing falls on; mu must be held.
func (u *upgrader) passingCond() *sync.Cond {
	if u.passed == nil {
		u.passed = sync.NewCond(&u.mu)
	}
	return u.passed
}

// stop runs once the signal loop ends: on sig, an operator's stop (nil:
// this process's own, once it handed over), after an upgrade in progress
// ends; if a successor serves by then, it gets sig. No upgrade starts
// from here on, and the last report of the control socket is written
// before this returns, and so before the process exits.
func (u *upgrader) stop(sig os.Signal) {
	u.mu.Lock()
	u.stopping = true
	u.mu.Unlock()
	why := "its own stop"
	if sig != nil {
		why = sig.String()
	}
	successor, _ := u.settle(why)
	u.mu.Lock()
	for u.passing > 0 {
		u.passingCond().Wait()
	}
	u.mu.Unlock()
	if u.ctl != nil {
		u.ctl.Close()
		<-u.served
	}
	if sig == nil || successor == 0 {
		return
	}
	u.log.WithFields(logrus.Fields{"signal": why, "pid": successor}).Info("a stop during the upgrade: passed on to the mediator that took over")
	if s, ok := sig.(syscall.Signal); ok {
		syscall.Kill(successor, s)
	}
}

// do runs one upgrade; it reports whether this process has handed over
// (and must stop once the report is written).
func (u *upgrader) do(req upgrade.Request) (upgrade.Report, bool) {
	rep := upgrade.Report{OldPid: os.Getpid(), Binary: req.Binary}
	if err := u.begin(); err != nil {
		rep.Error = err.Error()
		return rep, false
	}
	handedOver := false
	defer func() { u.end(handedOver, rep.NewPid) }()
	rep, handedOver = u.upgrade(req, rep)
	return rep, handedOver
}

// upgrade runs the upgrade do began.
func (u *upgrader) upgrade(req upgrade.Request, rep upgrade.Report) (upgrade.Report, bool) {
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
// then stops it (everything is closed already), or until a stop closes
// the control socket.
func (u *upgrader) serveUpgrades() {
	defer close(u.served)
	handedOver := false
	upgrade.ServeControl(u.ctl, func(req upgrade.Request) (upgrade.Report, bool) {
		rep, done := u.do(req)
		handedOver = done
		return rep, done
	})
	if handedOver {
		u.stopSelf()
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
