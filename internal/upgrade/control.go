package upgrade

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/internal/daemon"
)

// ListenControl listens on the control socket of the mediator serving
// socket: mode 0600, so only its user (and root) may ask for an upgrade.
// The mode is set after the bind, so ServeControl checks each peer's
// user as well.
func ListenControl(socket string) (net.Listener, error) {
	return daemon.ListenUnix(socket+ControlSuffix, 0o600, -1)
}

// ServeControl answers each request on l with do's report, one connection
// at a time (an upgrade at a time), until l is closed. do returns whether
// this process must stop serving the control socket (it handed over).
// Only this process's user and root are served: a connection made while
// the socket still had the umask's mode, before ListenControl's chmod,
// lasts beyond it, and an upgrade runs a binary of the asker's choice.
func ServeControl(l net.Listener, do func(Request) (Report, bool)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		var req Request
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		// Read before the check, so that a refused asker reads the refusal
		// rather than a reset connection; the limit bounds what it costs.
		line, err := bufio.NewReader(io.LimitReader(c, 64<<10)).ReadBytes('\n')
		if perr := operator(c); perr != nil {
			line, err = nil, perr
		}
		if err == nil {
			err = json.Unmarshal(line, &req)
		}
		if err == nil && req.Timeout < 0 {
			err = fmt.Errorf("timeout %v: want 0 (the default) or more", req.Timeout)
		}
		if err == nil && req.Binary != "" && !filepath.IsAbs(req.Binary) {
			// Resolved here, it would name a file in this process's
			// working directory, not the asker's.
			err = fmt.Errorf("binary %q: want an absolute path: %w", req.Binary, vocab.ErrInvalidArgument)
		}
		var rep Report
		stop := false
		if err != nil {
			rep = Report{OldPid: os.Getpid(), Error: fmt.Sprintf("upgrade request %q: %v", line, err)}
		} else {
			rep, stop = do(req)
		}
		b, _ := json.Marshal(rep)
		c.Write(append(b, '\n'))
		c.Close()
		if stop {
			return
		}
	}
}

// operator checks that c's peer is this process's user or root.
func operator(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("not a Unix socket connection: %w", vocab.ErrPermissionDenied)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials: %v: %w", err, vocab.ErrPermissionDenied)
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return fmt.Errorf("peer credentials: %v: %w", errors.Join(err, credErr), vocab.ErrPermissionDenied)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("uid %d: only the mediator's user (uid %d) and root may upgrade it: %w", cred.Uid, os.Geteuid(), vocab.ErrPermissionDenied)
	}
	return nil
}

// Ask asks the mediator serving socket to upgrade, and waits for its
// report. A report with an Error is returned with an error that wraps
// vocab.ErrUnavailable.
func Ask(socket string, req Request) (Report, error) {
	var rep Report
	path := socket + ControlSuffix
	c, err := net.Dial("unix", path)
	if errors.Is(err, os.ErrNotExist) {
		return rep, fmt.Errorf("no control socket %s: is a vgpu-mediator serving %s? %w", path, socket, vocab.ErrUnavailable)
	} else if errors.Is(err, os.ErrPermission) {
		return rep, fmt.Errorf("control socket %s: only the mediator's user and root may upgrade it: %w", path, vocab.ErrPermissionDenied)
	} else if err != nil {
		return rep, fmt.Errorf("control socket %s: %v: %w", path, err, vocab.ErrUnavailable)
	}
	defer c.Close()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return rep, fmt.Errorf("control socket %s: %v: %w", path, err, vocab.ErrUnavailable)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &rep)
	}
	if err != nil {
		return rep, fmt.Errorf("control socket %s: no report (the mediator may have died during the upgrade; its log says): %v: %w", path, err, vocab.ErrUnavailable)
	}
	if rep.Error != "" {
		return rep, Failed{rep}
	}
	return rep, nil
}

// Failed is an upgrade that failed, as its report says; it is
// vocab.ErrUnavailable.
type Failed struct{ Report Report }

func (f Failed) Error() string { return f.Report.Error }
func (f Failed) Unwrap() error { return vocab.ErrUnavailable }
