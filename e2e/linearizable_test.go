package e2e

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/daemon"
	"github.com/vgpu/vgpu/internal/linearize"
)

// Linearizability of coherent shared buffers: clients on three mediator
// processes read and write registers of a buffer a fourth session
// exported, and porcupine checks each register's short history
// (internal/linearize). Mediator 2 is killed with SIGKILL part way
// through; the others go on, delayed by a lease at most.
func TestCoherentBufferIsLinearizable(t *testing.T) {
	addr := freePort(t)
	startProc(t, "vgpu-node", "--listen", addr, "--devices", "1", "--memory", "256MiB", "--log-level", "warn")
	waitFor(t, "vgpu-node to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	var sockets []string
	var mediators []*proc
	for i := range 3 {
		dir := t.TempDir()
		sock := filepath.Join(dir, "m.sock")
		mediators = append(mediators, startProc(t, "vgpu-mediator", "--socket", sock, "--node", addr,
			"--state-dir", dir, "--quota", "", "--containerd", "", "--log-level", "warn"))
		sockets = append(sockets, sock)
		waitFor(t, fmt.Sprintf("mediator %d to serve on its socket", i), func() bool { return daemon.Serving(sock) })
	}
	const regs = 1200
	rig, err := linearize.Setup(sockets, regs)
	if err != nil {
		t.Fatal(err)
	}
	defer rig.Close()
	res, err := linearize.Run(rig, linearize.Options{
		Registers: regs, Ops: 4, InFlight: 24, MaxPause: 300 * time.Microsecond,
		KillAfter: 500, KillClient: 2, Kill: func() {
			p := mediators[2]
			p.cmd.Process.Kill()
			p.cmd.Wait()
		},
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d histories of %d operations checked, %d not linearizable, in %v", res.Histories, res.Ops, res.Violations, res.Elapsed)
	if res.Violations > 0 {
		t.Errorf("%d histories are not linearizable, e.g. %s", res.Violations, res.Example)
	}
	if res.Histories < 1000 {
		t.Errorf("only %d histories checked, want at least 1000", res.Histories)
	}
}
