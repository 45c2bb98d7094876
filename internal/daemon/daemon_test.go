package daemon

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// loop runs serveSignals on its own goroutine; the returned channel is
// closed when it returns.
func loop(log logrus.FieldLogger, reload func() error, deadline time.Duration) (chan<- os.Signal, <-chan struct{}) {
	ch := make(chan os.Signal)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		serveSignals(ch, log, reload, deadline)
	}()
	return ch, stopped
}

// send delivers sig to the loop, failing if the loop does not take it:
// the loop must always be ready for a signal.
func send(t *testing.T, ch chan<- os.Signal, sig os.Signal) {
	t.Helper()
	select {
	case ch <- sig:
	case <-time.After(5 * time.Second):
		t.Fatalf("the signal loop did not take %v within 5s", sig)
	}
}

func waitStopped(t *testing.T, stopped <-chan struct{}) {
	t.Helper()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM: the signal loop did not return within 5s")
	}
}

// TestReloadRunsOffTheSignalLoop: while a reload hangs, the loop logs it as
// stuck at its deadline and takes further signals; the SIGHUPs that came
// meanwhile make one more reload once it returns, never two at once; and
// SIGTERM stops the loop, even with a reload that never returns.
func TestReloadRunsOffTheSignalLoop(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	release := make(chan struct{})
	var runs, running, overlapped atomic.Int32
	started := make(chan struct{}, 10)
	reload := func() error {
		if running.Add(1) > 1 {
			overlapped.Add(1)
		}
		defer running.Add(-1)
		runs.Add(1)
		started <- struct{}{}
		<-release
		return errors.New("the file is wrong")
	}
	ch, stopped := loop(logger, reload, 50*time.Millisecond)
	send(t, ch, syscall.SIGHUP)
	<-started
	for range 3 {
		send(t, ch, syscall.SIGHUP)
	}
	waitLog(t, hook, "stuck")
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d reloads started while the first hung, want 1", n)
	}
	close(release) // the first and every later reload return at once
	<-started      // the coalesced SIGHUPs' one run
	waitLog(t, hook, "reload failed")
	time.Sleep(100 * time.Millisecond) // room for a wrong third run
	if n := runs.Load(); n != 2 {
		t.Errorf("%d reloads ran for 4 SIGHUPs that came during the first, want 2", n)
	}
	if n := overlapped.Load(); n != 0 {
		t.Errorf("%d reloads ran while another did", n)
	}
	send(t, ch, syscall.SIGTERM)
	waitStopped(t, stopped)

	hung := make(chan struct{})
	defer close(hung)
	ch, stopped = loop(logger, func() error { <-hung; return nil }, time.Hour)
	send(t, ch, syscall.SIGHUP)
	send(t, ch, syscall.SIGHUP)
	send(t, ch, syscall.SIGTERM)
	waitStopped(t, stopped)
}

// waitLog waits for a logged message containing want.
func waitLog(t *testing.T, hook *logtest.Hook, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, want) {
				return
			}
		}
	}
	t.Fatalf("nothing logged with %q within 5s", want)
}

// TestSignalsCaughtBeforeTheLoop sends this process a real SIGHUP after
// CatchSignals and before RunUntilStopped, as a reload can arrive while a
// daemon starts, right after its socket appears: without the early catch
// its default action ends the test binary. The reload must run once the
// loop does, and a real SIGTERM then stop it.
func TestSignalsCaughtBeforeTheLoop(t *testing.T) {
	s := CatchSignals()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the signal is delivered while no loop runs
	reloaded := make(chan struct{}, 1)
	stopped := make(chan os.Signal, 1)
	go func() {
		stopped <- s.RunUntilStopped(logrus.New(), func() error {
			reloaded <- struct{}{}
			return nil
		})
	}()
	select {
	case <-reloaded:
	case <-time.After(10 * time.Second):
		t.Fatal("the SIGHUP sent before the loop was not served as a reload")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case sig := <-stopped:
		if sig != syscall.SIGTERM {
			t.Fatalf("RunUntilStopped stopped by SIGTERM returned %v", sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not stop RunUntilStopped")
	}
}

// A daemon that stops itself (Signals.Stop) stops its loop as a stop
// signal does, and RunUntilStopped says no signal stopped it: a mediator
// that handed over tells its own stop from an operator's.
func TestStopOfItsOwn(t *testing.T) {
	s := CatchSignals()
	stopped := make(chan os.Signal, 1)
	go func() { stopped <- s.RunUntilStopped(logrus.New(), func() error { return nil }) }()
	s.Stop()
	select {
	case sig := <-stopped:
		if sig != nil {
			t.Fatalf("RunUntilStopped after Stop returned %v, want nil", sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not stop RunUntilStopped")
	}
}

// Signals that come after the stop stay caught until the process exits: a
// second SIGTERM, or a SIGHUP, while a daemon stops (a mediator waiting for
// an upgrade to end) would otherwise take their default action and end the
// process — here, the test binary — half way. Each is logged as ignored.
func TestSignalsAfterTheStopAreCaught(t *testing.T) {
	s := CatchSignals()
	log, hook := logtest.NewNullLogger()
	stopped := make(chan os.Signal, 1)
	go func() { stopped <- s.RunUntilStopped(log, func() error { return nil }) }()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not stop RunUntilStopped")
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT} {
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ignored := 0; ignored < 3; time.Sleep(10 * time.Millisecond) {
		ignored = 0
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, "signal ignored") {
				ignored++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 3 signals after the stop logged as ignored", ignored)
		}
	}
}

// A socket's file exists once it is bound, before it listens; Serving says
// no until it listens, and no again once it is closed with its file left.
func TestServingWaitsForListen(t *testing.T) {
	path := t.TempDir() + "/s.sock"
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	open := true
	defer func() {
		if open {
			syscall.Close(fd)
		}
	}()
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("bound socket has no file: %v", err)
	}
	if Serving(path) {
		t.Fatal("serving before listen")
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	if !Serving(path) {
		t.Fatal("not serving once listening")
	}
	syscall.Close(fd)
	open = false
	if Serving(path) {
		t.Fatal("serving once closed")
	}
}
