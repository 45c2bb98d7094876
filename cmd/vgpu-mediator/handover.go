package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/mediator"
)

// handOverOnSIGUSR2 makes SIGUSR2 an upgrade's stop: m hands over
// (Mediator.Handover) — its journaled sessions, their device memory kept
// by the nodes, wait for the next vgpu-mediator started on the same
// --state-dir, and their tenants reconnect to it — and then the process
// stops as on SIGTERM. Its sockets go with it; vgpuctl upgrade
// (upgrade.go) starts the next one itself and passes them on.
func handOverOnSIGUSR2(m *mediator.Mediator, log logrus.FieldLogger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2)
	go func() {
		<-ch
		log.Info("SIGUSR2: handing over; sessions are kept for the next vgpu-mediator on this --state-dir")
		if err := m.Handover(); err != nil {
			log.WithError(err).Warn("handing over")
		}
		syscall.Kill(os.Getpid(), syscall.SIGTERM) // the usual stop, with m closed already
	}()
}
