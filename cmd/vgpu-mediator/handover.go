package main

import (
	"os"
	"os/signal"
	"syscall"
)

// handOverOnSIGUSR2 makes SIGUSR2 an upgrade's stop: the mediator hands
// over (Mediator.Handover) — its journaled sessions, their device memory
// kept by the nodes, wait for the next vgpu-mediator started on the same
// --state-dir, and their tenants reconnect to it — and then the process
// stops. Its sockets go with it; vgpuctl upgrade (upgrade.go) starts the
// next one itself and passes them on. A SIGUSR2 during an upgrade, after
// a handover or once a stop began is ignored, saying why; a stop or a
// reload during the handover waits for it (upgrader.settle).
func (u *upgrader) handOverOnSIGUSR2() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2)
	go func() {
		for range ch {
			if err := u.begin(); err != nil {
				u.log.WithError(err).Warn("SIGUSR2 ignored")
				continue
			}
			u.log.Info("SIGUSR2: handing over; sessions are kept for the next vgpu-mediator on this --state-dir")
			if err := u.m.Handover(); err != nil {
				u.log.WithError(err).Warn("handing over")
			}
			u.end(true, 0)
			u.stopSelf() // the usual stop, with the mediator closed already
			return
		}
	}()
}
