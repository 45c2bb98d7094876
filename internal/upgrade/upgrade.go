// Package upgrade is a vgpu-mediator's live upgrade: the request on its
// control socket (vgpuctl upgrade → the running mediator, answered with a
// Report), and the handshake between the running mediator and the
// successor it starts, which takes over its listening sockets.
//
// The handshake runs on a SOCK_SEQPACKET socket pair, the successor's
// descriptor 3 (named by the environment variable Env), one JSON Message
// per packet:
//
//  1. The successor parses its flags and sends {"took":true}, or
//     {"error":...} and exits. Until then its standard error is a pipe the
//     predecessor reads, so the report of a binary that fails this early
//     (not a vgpu-mediator, a bad flag) quotes what it printed; from then on
//     it writes to the predecessor's standard error (descriptor 4).
//  2. The predecessor stops serving and hands over (its sessions' journals
//     kept, their node connections closed so the nodes park the frames),
//     then sends each listening socket as {"socket":PATH} with its
//     descriptor (SCM_RIGHTS), then {"go":true}. The sockets stay bound
//     at their paths all along: a connection that arrives meanwhile waits
//     in the socket's backlog.
//  3. The successor restores from the state directory, serves the sockets,
//     and sends {"serving":true,"pid":PID} (or {"error":...}).
//
// Invariants: the predecessor hands over only after step 1, and exits only
// after step 3 or once a successor (the new binary, or failing that its
// own) serves; a successor that fails step 1 leaves the predecessor
// serving as if nothing happened. A successor runs in a process group of
// its own, and one that fails is killed with its whole group: a wrapper
// script that starts the binary without exec leaves no process behind
// that could still take the sockets or serve.
package upgrade

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api/vocab"
)

// Env names, in a successor's environment, the descriptor of its
// handshake with its predecessor (3) and of the predecessor's standard
// error (4), as "3,4".
const Env = "VGPU_MEDIATOR_UPGRADE"

// ControlSuffix follows the mediator's socket path to name its control
// socket, on which vgpuctl upgrade asks for an upgrade. It is only the
// mediator's user's (mode 0600): operators only.
const ControlSuffix = ".upgrade"

// DefaultTimeout bounds each of the successor's two steps: taking over
// (step 1) and restoring to serving (step 3).
const DefaultTimeout = 2 * time.Minute

// Request is what vgpuctl upgrade sends on the control socket, one JSON line.
type Request struct {
	// Binary is the new vgpu-mediator; "" for the path of the running
	// one's executable, read again from disk (the new build put there).
	Binary string `json:"binary,omitempty"`
	// Timeout bounds each step of the successor; 0 means DefaultTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Report is the control socket's answer, one JSON line, once the upgrade
// succeeded or failed.
type Report struct {
	OldPid int    `json:"old_pid"`
	NewPid int    `json:"new_pid,omitempty"` // the process that serves now; 0 if still OldPid
	Binary string `json:"binary"`
	// Error says why the upgrade failed; "" when NewPid serves. On a
	// failure after the handover, the running mediator's own binary was
	// started again as NewPid (RolledBack).
	Error      string `json:"error,omitempty"`
	RolledBack bool   `json:"rolled_back,omitempty"`
}

// Message is one packet of the handshake.
type Message struct {
	Took    bool   `json:"took,omitempty"`
	Socket  string `json:"socket,omitempty"` // comes with the socket's descriptor
	Go      bool   `json:"go,omitempty"`
	Serving bool   `json:"serving,omitempty"`
	Pid     int    `json:"pid,omitempty"`
	Error   string `json:"error,omitempty"`
}

// send writes m on c as one packet, with fd attached if fd >= 0.
func send(c *net.UnixConn, m Message, fd int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// recv reads one packet of c, and the descriptor that came with it (-1 if
// none), by deadline.
func recv(c *net.UnixConn, deadline time.Time) (Message, int, error) {
	var m Message
	c.SetReadDeadline(deadline)
	b, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return m, -1, err
	}
	if n == 0 {
		return m, -1, io.EOF // the peer closed its end
	}
	fd := -1
	if oobn > 0 {
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil && len(cms) == 1 {
			if fds, err := unix.ParseUnixRights(&cms[0]); err == nil && len(fds) == 1 {
				fd = fds[0]
				unix.CloseOnExec(fd)
			}
		}
	}
	if err := json.Unmarshal(b[:n], &m); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return m, -1, fmt.Errorf("handshake packet %q: %v: %w", b[:n], err, vocab.ErrProtocol)
	}
	return m, fd, nil
}

// Successor is a new vgpu-mediator started to take over (the
// predecessor's side of the handshake).
type Successor struct {
	Binary string
	cmd    *exec.Cmd
	hs     *net.UnixConn
	exited chan struct{} // closed once the process has exited; then err is set
	err    error
	stderr tail          // what it printed before it took over
	copied chan struct{} // closed once stderr has all of it
}

// Start starts binary with args and waits, until timeout, for it to take
// over (step 1). Its failure to start, an exit or the timeout kill it and
// return an error that names the binary and quotes what it said; the
// caller still serves.
func Start(binary string, args []string, timeout time.Duration) (*Successor, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("handshake socket: %v: %w", err, vocab.ErrInternal)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "upgrade handshake"), os.NewFile(uintptr(fds[1]), "upgrade handshake")
	nc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		theirs.Close()
		return nil, fmt.Errorf("handshake socket: %v: %w", err, vocab.ErrInternal)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("successor's standard error: %v: %w", err, vocab.ErrInternal)
	}
	s := &Successor{Binary: binary, hs: nc.(*net.UnixConn), exited: make(chan struct{}), copied: make(chan struct{})}
	s.cmd = exec.Command(binary, args...)
	s.cmd.Stdout, s.cmd.Stderr = os.Stdout, pw
	s.cmd.ExtraFiles = []*os.File{theirs, os.Stderr} // 3 and 4
	s.cmd.Env = append(withoutEnv(os.Environ()), Env+"=3,4")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its group is killed if it fails (fail)
	err = s.cmd.Start()
	pw.Close()
	theirs.Close() // the successor's alone now: its exit ends the handshake
	if err != nil {
		pr.Close()
		nc.Close()
		return nil, fmt.Errorf("new binary %s did not start: %v: %w", binary, err, vocab.ErrInvalidArgument)
	}
	go func() {
		defer close(s.copied)
		s.stderr.copy(pr) // to our standard error too, until it takes over or exits
	}()
	go func() {
		s.err = s.cmd.Wait()
		close(s.exited)
	}()
	m, fd, err := recv(s.hs, time.Now().Add(timeout))
	if fd >= 0 {
		unix.Close(fd)
	}
	if err == nil && !m.Took {
		err = errors.New(cmp(m.Error, "it answered the handshake with something other than taking over"))
	}
	if err != nil {
		return nil, s.fail("before it took over", err)
	}
	return s, nil
}

// fail kills s if it still runs, and what it started, and returns why it
// failed, step naming when: its exit status and what it printed or sent,
// or err.
func (s *Successor) fail(when string, err error) error {
	select {
	case <-s.exited:
	case <-time.After(time.Second): // it may be exiting on its own, having said why
		s.killGroup()
		<-s.exited
	}
	s.killGroup() // its children, should it have exited before them

	s.hs.Close()
	select {
	case <-s.copied:
	case <-time.After(time.Second): // something it started holds its standard error
	}
	why := err.Error()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		why = "no answer before the timeout"
	} else if errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET) {
		why = "it closed the handshake"
	}
	msg := fmt.Sprintf("new binary %s failed %s: %s (%v)", s.Binary, when, why, s.err)
	if out := s.stderr.String(); out != "" {
		msg += "; it printed: " + out
	}
	return fmt.Errorf("%s: %w", msg, vocab.ErrUnavailable)
}

// killGroup kills the successor's process group: the process Start
// started and every process it started that did not leave the group. The
// group's id is the successor's pid, which the kernel gives no new process
// while the group has a member, so this reaches no one else.
func (s *Successor) killGroup() {
	unix.Kill(-s.cmd.Process.Pid, unix.SIGKILL) // ESRCH: none left
}

// Pid is the successor's process id.
func (s *Successor) Pid() int { return s.cmd.Process.Pid }

// Pass gives s the listening sockets, by path, and lets it restore and
// serve (step 2), then waits, until timeout, for it to serve (step 3).
// The caller keeps its own descriptors of the sockets: on an error, s is
// killed and they may be passed to another successor.
func (s *Successor) Pass(sockets map[string]*os.File, timeout time.Duration) error {
	// A successor that reads nothing more fills the handshake's buffer:
	// without this, a send would wait for it for ever.
	s.hs.SetWriteDeadline(time.Now().Add(timeout))
	for path, f := range sockets {
		if err := send(s.hs, Message{Socket: path}, int(f.Fd())); err != nil {
			return s.fail("as it was given the sockets", err)
		}
	}
	if err := send(s.hs, Message{Go: true}, -1); err != nil {
		return s.fail("as it was given the sockets", err)
	}
	m, fd, err := recv(s.hs, time.Now().Add(timeout))
	if fd >= 0 {
		unix.Close(fd)
	}
	if err == nil && !m.Serving {
		err = errors.New(cmp(m.Error, "it answered the handshake with something other than serving"))
	}
	if err != nil {
		return s.fail("after it took over, while it restored", err)
	}
	s.hs.Close()
	return nil
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// withoutEnv is env without Env.
func withoutEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, Env+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// tail keeps the last bytes a successor printed, at most tailBytes, while
// copying them to our standard error.
type tail struct {
	mu  sync.Mutex
	buf []byte // guarded by mu
}

const tailBytes = 2048

func (t *tail) copy(r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			os.Stderr.Write(line)
			t.mu.Lock()
			t.buf = append(t.buf, line...)
			if len(t.buf) > tailBytes {
				t.buf = t.buf[len(t.buf)-tailBytes:]
			}
			t.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// Predecessor is the mediator this process takes over from (the
// successor's side of the handshake).
type Predecessor struct {
	hs     *net.UnixConn
	stderr int // the predecessor's standard error
}

// Inherited returns the handshake with the predecessor when this process
// was started by one (Env set), and removes Env from the environment.
func Inherited() (*Predecessor, error) {
	v, ok := os.LookupEnv(Env)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(Env)
	hsFD, errFD, ok := strings.Cut(v, ",")
	h, err1 := strconv.Atoi(hsFD)
	e, err2 := strconv.Atoi(errFD)
	if !ok || err1 != nil || err2 != nil || h < 3 || e < 3 {
		return nil, fmt.Errorf("%s=%q: want the handshake's and standard error's descriptors, as 3,4: %w", Env, v, vocab.ErrInvalidArgument)
	}
	unix.CloseOnExec(h)
	unix.CloseOnExec(e)
	f := os.NewFile(uintptr(h), "upgrade handshake")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: descriptor %d: %v: %w", Env, h, err, vocab.ErrInvalidArgument)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("%s: descriptor %d is not a Unix socket: %w", Env, h, vocab.ErrInvalidArgument)
	}
	return &Predecessor{hs: uc, stderr: e}, nil
}

// Take says the flags are good and waits for the sockets (steps 1 and 2):
// from here on this process writes to the predecessor's standard error.
// It returns each socket's descriptor by path, once the predecessor has
// handed over.
func (p *Predecessor) Take() (map[string]*os.File, error) {
	if err := unix.Dup2(p.stderr, 2); err != nil {
		return nil, fmt.Errorf("the predecessor's standard error: %v: %w", err, vocab.ErrInternal)
	}
	unix.Close(p.stderr)
	if err := send(p.hs, Message{Took: true}, -1); err != nil {
		return nil, fmt.Errorf("handshake: %v: %w", err, vocab.ErrUnavailable)
	}
	sockets := map[string]*os.File{}
	for {
		// The predecessor hands over first: its sessions end, which
		// waits for their work in flight, so no deadline here; it ends
		// the handshake if it fails.
		m, fd, err := recv(p.hs, time.Time{})
		if err == nil && fd < 0 && m.Socket != "" {
			err = fmt.Errorf("socket %s came without its descriptor: %w", m.Socket, vocab.ErrProtocol)
		}
		if err != nil {
			for _, f := range sockets {
				f.Close()
			}
			return nil, fmt.Errorf("handshake: %w", err)
		}
		switch {
		case m.Go:
			return sockets, nil
		case m.Socket != "":
			sockets[m.Socket] = os.NewFile(uintptr(fd), m.Socket)
		default:
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
}

// Done tells the predecessor this process serves (err nil) or why it
// cannot (at step 1 or 3), and ends the handshake.
func (p *Predecessor) Done(err error) {
	m := Message{Serving: err == nil, Pid: os.Getpid()}
	if err != nil {
		m.Error = err.Error()
	}
	send(p.hs, m, -1)
	p.hs.Close()
}
