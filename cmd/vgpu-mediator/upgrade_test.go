package main

import (
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"
)

// A reload that waited for an upgrade is passed on to the successor before
// the stop that follows the handover returns — so before this process
// exits — not left to a goroutine racing the exit (seen in CI: the SIGHUP
// waited, the upgrade handed over, and the old process exited without
// passing it on).
func TestStopWaitsForReloadPassedOn(t *testing.T) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log, hook := logtest.NewNullLogger()
	u := &upgrader{log: log}
	if err := u.begin(); err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan error, 1)
	go func() { reloaded <- u.reload() }()
	waitPassing(t, u)
	// This test process stands in for the successor: the SIGHUP comes here.
	u.end(true, os.Getpid())
	u.stop(nil)
	if !logged(hook, "SIGHUP: passed on to the mediator that took over") {
		t.Fatalf("stop returned before the waiting reload was passed on; log: %v", hook.AllEntries())
	}
	select {
	case <-hup:
	case <-time.After(10 * time.Second):
		t.Fatal("the successor got no SIGHUP")
	}
	if err := <-reloaded; err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// waitPassing waits until a reload waits for the upgrade.
func waitPassing(t *testing.T, u *upgrader) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		u.mu.Lock()
		n := u.passing
		u.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the reload did not start waiting for the upgrade")
		}
	}
}

func logged(hook *logtest.Hook, msg string) bool {
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}
