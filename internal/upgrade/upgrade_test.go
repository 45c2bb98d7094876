package upgrade

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

// childEnv makes the test binary, started as a successor, play one: "serve"
// takes the sockets and answers two connections on each with its pid;
// "fail-late" takes them and then says it cannot restore.
const childEnv = "UPGRADE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "serve":
		os.Exit(serveChild())
	case "took-then-stall": // takes over, then reads nothing more
		pred, err := Inherited()
		if err == nil {
			err = send(pred.hs, Message{Took: true}, -1)
		}
		if err != nil {
			os.Exit(2)
		}
		time.Sleep(time.Hour)
	case "ask":
		_, err := Ask(os.Getenv("UPGRADE_TEST_SOCKET"), Request{Binary: "/tmp/not-the-operators"})
		fmt.Println(err)
		os.Exit(0)
	case "fail-late":
		pred, err := Inherited()
		if err == nil {
			_, err = pred.Take()
		}
		if err == nil {
			pred.Done(errors.New("restore failed: the state directory is unreadable"))
		}
		os.Exit(1)
	}
}

func serveChild() int {
	pred, err := Inherited()
	if err != nil || pred == nil {
		fmt.Fprintln(os.Stderr, "no predecessor:", err)
		return 2
	}
	files, err := pred.Take()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var ls []net.Listener
	for _, f := range files {
		l, err := net.FileListener(f)
		if err != nil {
			pred.Done(err)
			return 2
		}
		ls = append(ls, l)
	}
	pred.Done(nil)
	for _, l := range ls {
		for range 2 {
			c, err := l.Accept()
			if err != nil {
				return 2
			}
			fmt.Fprintf(c, "served by %d\n", os.Getpid())
			c.Close()
		}
	}
	return 0
}

// script writes an executable shell script of body.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "new-binary")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from the successor: %v", err)
	}
	return strings.TrimSpace(line)
}

// TestPassedSocketServedBySuccessor: the successor serves the socket
// passed to it, at the same path, including a connection made while no
// process accepted (after the predecessor stopped, before the successor
// took it), which waited in the backlog.
func TestPassedSocketServedBySuccessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	f, err := ul.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Setenv(childEnv, "serve")
	s, err := Start(os.Args[0], nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // the predecessor stops accepting; the socket stays bound
	early, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("connect between the two processes: %v", err)
	}
	defer early.Close()
	if err := s.Pass(map[string]*os.File{path: f}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("served by %d", s.Pid())
	if got := readLine(t, early); got != want {
		t.Fatalf("the connection made during the handover: %q, want %q", got, want)
	}
	late, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if got := readLine(t, late); got != want {
		t.Fatalf("a connection after the handover: %q, want %q", got, want)
	}
	<-s.exited
}

// TestStartQuotesAFailingBinary: a binary that exits before taking over
// fails Start with its exit status and what it printed.
func TestStartQuotesAFailingBinary(t *testing.T) {
	_, err := Start(script(t, "echo 'cannot load libcuda' >&2; exit 3"), nil, 10*time.Second)
	if !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "cannot load libcuda") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Start of a binary that exits 3: %v", err)
	}
	_, err = Start(filepath.Join(t.TempDir(), "missing"), nil, 10*time.Second)
	if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("Start of a missing binary: %v", err)
	}
}

// TestStartTimesOut: a binary that never answers is killed at the timeout.
func TestStartTimesOut(t *testing.T) {
	start := time.Now()
	_, err := Start(script(t, "exec sleep 60"), nil, 300*time.Millisecond)
	if !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "no answer before the timeout") || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Start of a binary that never answers: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Start took %v with a 300ms timeout", took)
	}
}

// TestPassReportsAFailedRestore: a successor that takes over and then
// fails makes Pass fail with what it said.
func TestPassReportsAFailedRestore(t *testing.T) {
	t.Setenv(childEnv, "fail-late")
	s, err := Start(os.Args[0], nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Pass(nil, 10*time.Second)
	if !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "the state directory is unreadable") || !strings.Contains(err.Error(), "while it restored") {
		t.Fatalf("Pass to a successor that fails to restore: %v", err)
	}
}

// TestControlSocket: Ask finds no mediator where none serves, and a bad
// request is answered with a report naming it, not acted on.
func TestControlSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	if _, err := Ask(sock, Request{}); !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "no control socket") {
		t.Fatalf("Ask with no mediator: %v", err)
	}
	l, err := ListenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Stat(sock + ControlSuffix); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	asked := make(chan Request, 1)
	go ServeControl(l, func(r Request) (Report, bool) {
		asked <- r
		return Report{OldPid: 1, NewPid: 2, Binary: r.Binary}, false
	})
	if _, err := Ask(sock, Request{Timeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "timeout -1s") {
		t.Fatalf("Ask with a negative timeout: %v", err)
	}
	rep, err := Ask(sock, Request{Binary: "/new"})
	if err != nil || rep.NewPid != 2 || rep.Binary != "/new" {
		t.Fatalf("Ask: %+v, %v", rep, err)
	}
	if r := <-asked; r.Binary != "/new" {
		t.Fatalf("the upgrade asked for %+v, want binary /new", r)
	}
}

// TestControlSocketRefusesOtherUsers: a connection from a user other than
// the mediator's (and root's) is refused whatever the socket's mode — as
// during the moment between the socket's bind, with the umask's mode, and
// its chmod to 0600, when another user may connect and then keep the
// connection. Here the socket is left 0666 and the request comes from
// nobody; it must not reach the upgrade.
func TestControlSocketRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to connect as another user")
	}
	dir, err := os.MkdirTemp("", "upgrade-ctl") // t.TempDir's parent is root's alone
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "m.sock")
	l, err := net.Listen("unix", sock+ControlSuffix)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.Chmod(sock+ControlSuffix, 0o666)
	asked := make(chan Request, 1)
	go ServeControl(l, func(r Request) (Report, bool) {
		asked <- r
		return Report{OldPid: 1, NewPid: 2, Binary: r.Binary}, false
	})
	self, err := os.ReadFile(os.Args[0]) // its directory is the test's user's alone
	if err != nil {
		t.Fatal(err)
	}
	asker := filepath.Join(dir, "asker")
	if err := os.WriteFile(asker, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(asker)
	cmd.Env = append(os.Environ(), childEnv+"=ask", "UPGRADE_TEST_SOCKET="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the request as nobody: %v\n%s", err, out)
	}
	select {
	case r := <-asked:
		t.Fatalf("a request from uid 65534 reached the upgrade: %+v", r)
	default:
	}
	if !strings.Contains(string(out), "uid 65534") {
		t.Fatalf("the answer to uid 65534: %s, want a refusal naming it", out)
	}
	if rep, err := Ask(sock, Request{Binary: "/new"}); err != nil || rep.Binary != "/new" {
		t.Fatalf("Ask as root: %+v, %v", rep, err)
	}
}

// TestPassTimesOutOnAStalledSuccessor: a successor that takes over and
// then reads nothing fills the handshake's buffer as the sockets are
// passed; Pass still fails at its timeout, having killed it, rather than
// blocking in a send for ever with nothing serving.
func TestPassTimesOutOnAStalledSuccessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sockets := map[string]*os.File{}
	for i := range 5000 { // more packets than the handshake's buffer holds
		sockets[fmt.Sprintf("%s.%d", path, i)] = f
	}
	t.Setenv(childEnv, "took-then-stall")
	s, err := Start(os.Args[0], nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.cmd.Process.Kill()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Pass(sockets, 500*time.Millisecond) }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Pass to a stalled successor still blocks after 20s with a 500ms timeout")
	}
	if !errors.Is(err, vocab.ErrUnavailable) || !strings.Contains(err.Error(), "as it was given the sockets") {
		t.Fatalf("Pass to a stalled successor, after %v: %v", time.Since(start), err)
	}
}

// TestControlSocketRefusesARelativeBinary: a request naming a relative
// binary is refused, naming it, rather than run from the mediator's
// working directory, which is not the asker's.
func TestControlSocketRefusesARelativeBinary(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	l, err := ListenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	asked := make(chan Request, 1)
	go ServeControl(l, func(r Request) (Report, bool) {
		asked <- r
		return Report{OldPid: 1, NewPid: 2, Binary: r.Binary}, false
	})
	if _, err := Ask(sock, Request{Binary: "bin/vgpu-mediator"}); err == nil || !strings.Contains(err.Error(), `"bin/vgpu-mediator"`) {
		t.Fatalf("Ask with a relative binary: %v", err)
	}
	select {
	case r := <-asked:
		t.Fatalf("a relative binary reached the upgrade: %+v", r)
	default:
	}
}

// A successor that fails is killed with its whole process group, not
// only the process Start started: a wrapper script that runs the binary
// without exec — here one whose child takes over and then stalls, one
// that never answers, one that exits leaving a child — leaves nothing
// running. Without the group, the stalled child would live on holding the
// handshake and whatever sockets it was passed.
func TestFailedSuccessorKilledWithItsGroup(t *testing.T) {
	for name, tc := range map[string]struct {
		env, body string
		pass      bool // fails at Pass rather than Start
	}{
		"child took over, then stalled": {env: "took-then-stall", body: `"` + os.Args[0] + `" & echo $! > "$PIDFILE"; wait`, pass: true},
		"never answers":                 {body: `sleep 300 & echo $! > "$PIDFILE"; wait`},
		"exits, leaving a child":        {body: `sleep 300 & echo $! > "$PIDFILE"; exit 1`},
	} {
		t.Run(name, func(t *testing.T) {
			pidfile := filepath.Join(t.TempDir(), "pid")
			t.Setenv("PIDFILE", pidfile)
			if tc.env != "" {
				t.Setenv(childEnv, tc.env)
			}
			s, err := Start(script(t, tc.body), nil, 500*time.Millisecond)
			if tc.pass {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				err = s.Pass(nil, 500*time.Millisecond)
			}
			if !errors.Is(err, vocab.ErrUnavailable) {
				t.Fatalf("a failing successor: %v, want unavailable", err)
			}
			b, rerr := os.ReadFile(pidfile)
			var child int
			if _, serr := fmt.Sscan(string(b), &child); rerr != nil || serr != nil || child <= 0 {
				t.Fatalf("the wrapper's child's pid: %q, %v, %v", b, rerr, serr)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !exited(child) {
				if time.Now().After(deadline) {
					syscall.Kill(child, syscall.SIGKILL)
					t.Fatalf("the failed successor's child, pid %d, still runs", child)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// exited reports whether process pid has ended (a zombie has).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}
