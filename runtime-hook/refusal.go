package runtimehook

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// A refused admission must reach the operator as the mediator's reason, first.
// The hook that registers the container runs inside runc, and what Docker
// and containerd show for a failed create is the last error line of runc's
// --log: runc's own, which puts the hook's stderr at the end of a chain
// ("runc create failed: unable to start container process: error during
// container init: error running hook #0: error running hook: exit status 1,
// stdout: , stderr: vgpu-hook: …"). So the hook writes the mediator's
// reason as its first line behind refusedMarker, and the wrapper, which
// stays runc's parent on create (RunCreate), finds that line in runc's
// last error and logs it after runc's, reason first, with runc's chain
// below it.

// refusedMarker begins the first line of the hook's message for a
// registration the mediator refused; the mediator's reason follows.
const refusedMarker = "vgpu-hook: " + refusedPrefix

const refusedPrefix = "the mediator refused the container: "

// RefusedError is a registration the mediator answered with an error: its
// message, the mediator's own words, comes first, on a line of its own, and
// the request that was refused below it.
type RefusedError struct {
	Reason  string // the mediator's message
	Request string // what was asked, for the line below
	Err     error  // the error of the call (api sentinels through Unwrap)
}

func (e *RefusedError) Error() string {
	return refusedPrefix + e.Reason + "\n  (" + e.Request + ")"
}

func (e *RefusedError) Unwrap() error { return e.Err }

// RunCreate runs the real runtime's create (argv, argv[0] the runtime) as
// this process's child with its stdio and every descriptor it inherited,
// and returns its exit status; where it failed because the mediator refused
// the container, it first logs the mediator's reason (explainRefusal). It
// is for a create whose bundle asks for a vGPU: everything else execs the
// runtime, as before. The child dies with this process (Pdeathsig), and
// the signals a caller sends to stop a create are passed on to it.
func (inv *Invocation) RunCreate(argv []string) int {
	// Pdeathsig follows the thread that forked, not the process: keep it.
	runtime.LockOSThread()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	// Descriptors above 2 that this process inherited stay open across the
	// fork and exec (Go opens its own close-on-exec), as runc's
	// --preserve-fds expects.
	pid, err := syscall.ForkExec(inv.Runtime, argv, &syscall.ProcAttr{
		Env: os.Environ(), Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		inv.ReportError(os.Stderr, fmt.Errorf("start %s: %w", inv.Runtime, err))
		return 1
	}
	go func() {
		for s := range sigs {
			_ = syscall.Kill(pid, s.(syscall.Signal))
		}
	}()
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	signal.Stop(sigs)
	switch {
	case err != nil:
		inv.ReportError(os.Stderr, fmt.Errorf("wait for %s: %w", inv.Runtime, err))
		return 1
	case ws.Exited() && ws.ExitStatus() == 0:
		return 0
	}
	inv.explainRefusal(os.Stderr)
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// explainRefusal logs the mediator's reason for refusing the container, if
// the runtime's last logged error is the hook's refusal: one error line
// whose message starts with the reason, runc's chain on the lines below,
// so that it is the line containerd and Docker show, and its first line
// what the operator reads first.
func (inv *Invocation) explainRefusal(stderr io.Writer) {
	if inv.Log == "" {
		return
	}
	raw, err := os.ReadFile(inv.Log)
	if err != nil {
		return
	}
	last := lastLoggedError(raw, inv.LogFormat == "json")
	if reason, ok := refusalIn(last); ok {
		inv.report(stderr, "vgpu: "+refusedPrefix+reason+"\n"+last)
	}
}

// refusalIn finds the hook's refusal in msg, runc's error, and returns the
// mediator's reason: the rest of the marker's line.
func refusalIn(msg string) (string, bool) {
	_, after, ok := strings.Cut(msg, refusedMarker)
	if !ok {
		return "", false
	}
	reason, _, _ := strings.Cut(after, "\n")
	reason = strings.TrimSpace(reason)
	return reason, reason != ""
}

// textMsg is the msg field of a line of logrus's text format.
var textMsg = regexp.MustCompile(`\bmsg=("(?:[^"\\]|\\.)*"|\S*)`)

// lastLoggedError is the message of the last error entry of a runtime log
// in runc's JSON or text (logrus) format, as containerd reads it for a
// failed create; "" if it has none.
func lastLoggedError(raw []byte, asJSON bool) string {
	var last string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if asJSON {
			var e struct{ Level, Msg string }
			if json.Unmarshal(line, &e) == nil && e.Level == "error" {
				last = e.Msg
			}
			continue
		}
		if !bytes.Contains(line, []byte("level=error")) {
			continue
		}
		if m := textMsg.FindSubmatch(line); m != nil {
			msg := string(m[1])
			if u, err := strconv.Unquote(msg); err == nil {
				msg = u
			}
			last = msg
		}
	}
	return strings.TrimSpace(last)
}
