package netlab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// Command returns a command that runs name with args inside host's network
// namespace, through nsenter --net (util-linux, which Debian always
// installs). nsenter enters the namespace and execs name in place, so the
// command's process is the program itself: signals, Process.Kill and the
// exit status are its own. Apart from the network the program shares
// everything with the test: files, Unix sockets with a path, mounts, pids.
//
// The command dies with the test process (SIGKILL as parent-death signal,
// unless the caller replaces SysProcAttr). The caller starts and waits for
// it as for any exec.Cmd; whatever is still running in the lab's
// namespaces at cleanup is SIGKILLed.
func (l *Lab) Command(host, name string, args ...string) *exec.Cmd {
	h := l.host(host)
	enter, err := nsenter()
	cmd := exec.Command(enter, append([]string{"--net=" + filepath.Join("/run/netns", h.nsName), "--", name}, args...)...)
	if err != nil {
		cmd.Err = fmt.Errorf("netlab: command %s in host %s: %w", name, host, err)
	} else if !strings.Contains(name, "/") {
		// Look name up here, as exec.Command would, so that a missing
		// program fails Start rather than as nsenter's exit status.
		if _, err := exec.LookPath(name); err != nil {
			cmd.Err = fmt.Errorf("netlab: command %s in host %s: %w", name, host, err)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Proc is a long-running program the lab started in a host, with its
// stdout and stderr in a log file. The lab stops it at cleanup.
type Proc struct {
	Host string
	Name string    // the log's name: <host>-<program>[-N]
	Cmd  *exec.Cmd // started; the lab waits for it, the caller must not
	Log  string    // path of the file with its stdout and stderr

	done chan struct{}
	err  error // from Wait; set before done is closed
}

// Start starts name with args in host, its output going to a file in
// Dir(), and stops it at cleanup (SIGTERM, SIGKILL after 5 seconds). It
// fails the test if the program cannot be started.
func (l *Lab) Start(host, name string, args ...string) *Proc {
	l.tb.Helper()
	p, err := l.start(host, name, args...)
	if err != nil {
		l.tb.Fatalf("netlab: %v", err)
	}
	return p
}

func (l *Lab) start(host, name string, args ...string) (*Proc, error) {
	cmd := l.Command(host, name, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("start %s in host %s: the lab is closed", name, host)
	}
	logName := host + "-" + filepath.Base(name)
	l.nprocs[logName]++
	if k := l.nprocs[logName]; k > 1 {
		logName = fmt.Sprintf("%s-%d", logName, k)
	}
	p := &Proc{Host: host, Name: logName, Cmd: cmd, Log: filepath.Join(l.dir, logName+".log"), done: make(chan struct{})}
	f, err := os.Create(p.Log)
	if err != nil {
		return nil, fmt.Errorf("start %s in host %s: %w", name, host, err)
	}
	// The child writes to the file itself; the parent's copy is closed
	// once it has started.
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s in host %s: %w", name, host, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	l.procs = append(l.procs, p)
	return p, nil
}

// Done is closed when the program has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the program has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns how the program ended (Wait's error), or nil while it runs.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Stop sends SIGTERM, then SIGKILL if the program is still there after
// grace, and returns once it has exited, with Wait's error. Stopping a
// program that has exited returns how it ended.
func (p *Proc) Stop(grace time.Duration) error {
	if !p.Exited() {
		p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			p.Cmd.Process.Kill()
			<-p.done
		}
	}
	return p.err
}

// Kill SIGKILLs the program (a crash, as the rest of the system sees it)
// and returns once it has exited.
func (p *Proc) Kill() {
	p.Cmd.Process.Kill()
	<-p.done
}

// Tail returns the last n lines of the program's output.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.Log)
	ls := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return string(bytes.Join(ls, []byte("\n")))
}

// WaitUp polls ok every 20ms until it holds, and fails if the program
// exits first or within passes, with the end of its log.
func (p *Proc) WaitUp(within time.Duration, ok func() bool) error {
	deadline := time.Now().Add(within)
	for !ok() {
		if p.Exited() {
			return fmt.Errorf("%s exited (%v) before it was up:\n%s", p.Name, p.err, p.Tail(30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not up after %v:\n%s", p.Name, within, p.Tail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// logTails logs the end of every started program's output, for a failed
// test.
func (l *Lab) logTails(n int) {
	l.mu.Lock()
	procs := l.procs
	l.mu.Unlock()
	for _, p := range procs {
		state := "running"
		if p.Exited() {
			state = fmt.Sprintf("exited: %v", p.err)
		}
		l.tb.Logf("--- %s (%s), last lines of %s ---\n%s", p.Name, state, p.Log, p.Tail(n))
	}
}

// Do runs f on an OS thread inside host's network namespace: sockets f
// makes belong to the host, and keep belonging to it after Do returns.
// Goroutines that f starts run elsewhere, in the root namespace.
func (l *Lab) Do(host string, f func() error) error {
	return l.doIn(&l.host(host).ns, f)
}

// doIn runs f on an OS thread inside n; see Do.
func (l *Lab) doIn(n *ns, f func() error) error {
	var ferr error
	err := onThread(func(orig netns.NsHandle) error {
		l.nsMu.RLock()
		name, gone := n.name, l.gone // Close clears the name
		var err error
		if !gone {
			err = netns.Set(n.handle)
		}
		l.nsMu.RUnlock()
		if gone {
			return fmt.Errorf("netlab: the lab is closed")
		}
		if err != nil {
			return fmt.Errorf("netlab: enter %s: %w", name, err)
		}
		ferr = f()
		if err := netns.Set(orig); err != nil {
			return fmt.Errorf("netlab: leave %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return ferr
}

// Dial connects from host, as net.Dialer.DialContext with a timeout. For
// IP networks addr must hold an IP address, not a name: a name with
// addresses of both families is dialled from several goroutines, which
// would not all be in the host.
func (l *Lab) Dial(ctx context.Context, host, network, addr string, timeout time.Duration) (net.Conn, error) {
	if !strings.HasPrefix(network, "unix") {
		if ip, _, err := net.SplitHostPort(addr); err != nil || net.ParseIP(ip) == nil {
			return nil, fmt.Errorf("netlab: dial %s %q from host %s: want an IP address and port", network, addr, host)
		}
	}
	var c net.Conn
	err := l.Do(host, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: dial %s %s from host %s: %w", network, addr, host, err)
	}
	return c, nil
}

// Listen listens in host, as net.Listen.
func (l *Lab) Listen(host, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.Do(host, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: listen on %s %s in host %s: %w", network, addr, host, err)
	}
	return ln, nil
}
