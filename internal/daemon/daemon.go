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
// is not a socket, or a socket that still answers.
func ListenUnix(path string, mode os.FileMode) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; not replacing it", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
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
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// RunUntilStopped blocks until SIGINT or SIGTERM, calling reload on each
// SIGHUP (a failed reload is logged; the daemon keeps its old settings).
func RunUntilStopped(log logrus.FieldLogger, reload func() error) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(ch)
	for sig := range ch {
		if sig != syscall.SIGHUP {
			log.WithField("signal", sig.String()).Info("stopping")
			return
		}
		if err := reload(); err != nil {
			log.WithError(err).Error("SIGHUP: reload failed")
		}
	}
}
