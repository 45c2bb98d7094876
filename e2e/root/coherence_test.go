package root

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu/vgpu/internal/linearize"
	"github.com/vgpu/vgpu/internal/netlab"
)

// TestNetlabCoherentBufferIsLinearizable: a vgpu-node and three
// vgpu-mediators, each on its own host (network namespace), the mediators'
// links shaped with a delay and jitter; clients of every mediator read and
// write registers of a coherent buffer and porcupine checks each
// register's history (internal/linearize). The third mediator is killed
// part way through.
func TestNetlabCoherentBufferIsLinearizable(t *testing.T) {
	lab := netlab.New(t, "node", "m0", "m1", "m2")
	bin := netlabBinaries(t)
	nodeAddr := lab.Addr("node", 7070)
	startLabNode(t, lab, bin, "node", nodeAddr, "m0", "--devices", "1", "--memory", "256MiB", "--log-level", "warn")
	dir := t.TempDir()
	var sockets []string
	var mediators []*netlab.Proc
	for i, m := range []string{"m0", "m1", "m2"} {
		// Different delays, so that messages of different mediators
		// overtake each other; jitter varies each one's.
		lab.Shape(m, netlab.Netem{Delay: time.Duration(100*(i+1)) * time.Microsecond, Jitter: 50 * time.Microsecond})
		sock := filepath.Join(dir, m+".sock")
		med := startLabMediator(t, lab, bin, m, sock, dir, "--node", nodeAddr, "--log-level", "warn")
		sockets = append(sockets, sock)
		mediators = append(mediators, med)
	}
	const regs = 1100
	rig, err := linearize.Setup(sockets, regs)
	if err != nil {
		t.Fatal(err)
	}
	defer rig.Close()
	res, err := linearize.Run(rig, linearize.Options{
		Registers: regs, Ops: 4, InFlight: 32, MaxPause: 500 * time.Microsecond,
		KillAfter: 400, KillClient: 2, Kill: mediators[2].Kill,
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d histories of %d operations across %d hosts checked, %d not linearizable, in %v",
		res.Histories, res.Ops, len(lab.Hosts()), res.Violations, res.Elapsed)
	if res.Violations > 0 {
		t.Errorf("%d histories are not linearizable, e.g. %s", res.Violations, res.Example)
	}
	if res.Histories < 1000 {
		t.Errorf("only %d histories checked, want at least 1000", res.Histories)
	}
}
