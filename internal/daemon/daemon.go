// Package daemon holds what the vgpu binaries share at start-up: logging
// set-up, listening on a Unix socket safely, and waiting for a stop signal.
package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// Logger returns a logger at level ("debug", "info", "warn", "error") for
// the named component.
func Logger(component, level string) (*logrus.Entry, error) {
	l := logrus.New()
	lv, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	l.SetLevel(lv)
	l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	return l.WithField("component", component), nil
}

// ListenUnix listens on path, creating its directory and replacing a stale
// socket left by a process that died. It refuses to replace anything that
// is not a socket, or a socket that still answers. The socket gets group
// gid (-1: the process's) and then mode; connecting needs write permission
// on it. Both are set after the socket is bound, so they are not the only
// check of who connects: the mediator checks each peer's credentials too.
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; not replacing it", path)
		}
		if Serving(path) {
			return nil, fmt.Errorf("%s is in use by a running process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("socket group %d: %w", gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Serving says whether a process accepts connections on the Unix socket
// at path. A socket's file exists from its bind(2), before its listen(2),
// and a dial in between is refused: the file alone does not say that the
// daemon behind it serves.
func Serving(path string) bool {
	c, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// ReloadDeadline is how long a reload may run before RunUntilStopped logs
// that it is stuck.
const ReloadDeadline = 10 * time.Second

// Signals are a daemon's stop and reload signals, caught from the start of
// its run — before it binds a socket or restores anything — and served by
// RunUntilStopped once it serves. A SIGHUP sent as soon as the socket
// exists (a reload after an edit of the quota file) so never meets the
// default action, which ends the process; a signal that arrives while the
// daemon starts waits in the channel until then.
type Signals struct{ ch chan os.Signal }

// CatchSignals starts catching SIGINT, SIGTERM and SIGHUP.
func CatchSignals() *Signals {
	// Buffered for a few: signal.Notify drops what a full channel cannot
	// take, and a stop must not be lost behind a reload sent during start.
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	return &Signals{ch: ch}
}

// Stop makes RunUntilStopped return as a stop signal does, but with no
// signal: a daemon that ends itself (a mediator that handed over to its
// successor), which its caller must tell from an operator's stop.
func (s *Signals) Stop() {
	select {
	case s.ch <- stopSelf{}:
	default: // full of signals: the loop takes it after them
		go func() { s.ch <- stopSelf{} }()
	}
}

// stopSelf is the stop Signals.Stop puts among the signals.
type stopSelf struct{}

func (stopSelf) String() string { return "its own stop" }
func (stopSelf) Signal()        {}

// RunUntilStopped blocks until SIGINT or SIGTERM, calling reload on each
// SIGHUP (a failed reload is logged; the daemon keeps its old settings),
// and returns the stop signal; nil after a Stop.
//
// A reload runs off the signal loop, so that a stop signal is answered at
// once whatever the reload does (a quota file on a hung mount, say).
// Reloads run one at a time: the SIGHUPs that arrive while one runs are
// coalesced into one more run after it, which reads whatever changed
// meanwhile. A reload still running after ReloadDeadline is logged as
// stuck, and later SIGHUPs wait for it.
//
// The signals stay caught after the stop, until the process exits: a stop
// under way — a mediator waiting for an upgrade to end before it passes
// the stop on — is not cut short by a second SIGTERM or SIGINT, nor ended
// by a SIGHUP's default action; each is logged as ignored. SIGKILL ends a
// daemon whose stop is stuck.
func (s *Signals) RunUntilStopped(log logrus.FieldLogger, reload func() error) os.Signal {
	sig := serveSignals(s.ch, log, reload, ReloadDeadline)
	go func() {
		for late := range s.ch {
			log.WithField("signal", late.String()).Warn("a stop is under way: signal ignored (SIGKILL ends the process)")
		}
	}()
	if sig == (stopSelf{}) {
		return nil
	}
	return sig
}

// serveSignals is RunUntilStopped's loop over the signals of ch, with the
// deadline of a reload; it returns the stop.
func serveSignals(ch <-chan os.Signal, log logrus.FieldLogger, reload func() error, deadline time.Duration) os.Signal {
	var (
		done  chan error       // the running reload's result; nil while none runs
		stuck <-chan time.Time // the running reload's deadline
		again bool             // a SIGHUP came while a reload ran
	)
	start := func() {
		d := make(chan error, 1) // a reload abandoned at a stop never blocks
		go func() { d <- reload() }()
		done, stuck = d, time.After(deadline)
	}
	for {
		select {
		case sig := <-ch:
			switch {
			case sig != syscall.SIGHUP:
				log.WithField("signal", sig.String()).Info("stopping")
				return sig
			case done != nil:
				again = true
			default:
				start()
			}
		case err := <-done:
			if err != nil {
				log.WithError(err).Error("SIGHUP: reload failed")
			}
			done, stuck = nil, nil
			if again {
				again = false
				start()
			}
		case <-stuck:
			stuck = nil
			log.WithField("deadline", deadline.String()).Error("SIGHUP: reload stuck past its deadline; still serving signals, later SIGHUPs wait for it")
		}
	}
}
