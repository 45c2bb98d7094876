package upgrade

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/internal/daemon"
)

// ListenControl listens on the control socket of the mediator serving
// socket: mode 0600, so only its user (and root) may ask for an upgrade.
func ListenControl(socket string) (net.Listener, error) {
	return daemon.ListenUnix(socket+ControlSuffix, 0o600, -1)
}

// ServeControl answers each request on l with do's report, one connection
// at a time (an upgrade at a time), until l is closed. do returns whether
// this process must stop serving the control socket (it handed over).
func ServeControl(l net.Listener, do func(Request) (Report, bool)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		var req Request
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &req)
		}
		if err == nil && req.Timeout < 0 {
			err = fmt.Errorf("timeout %v: want 0 (the default) or more", req.Timeout)
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
