package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Registers in a shared buffer through mediator kills: one tenant exports
// a coherent buffer through one vgpu-mediator process, another imports it
// through a second, and each writes registers in it that the other reads
// (one writer per register, as in TestRegistersLinearizableThroughMediatorKills,
// whose checker this uses). Either mediator is SIGKILLed at random points
// and started again on its state directory: the exporter's session comes
// back as the same object, the importer's imports it again, and every
// register's history stays linearizable with no acknowledged write lost.
// Writes are inline copies, which the SDK sends again after a reconnect:
// the test checks that the kills cut some, else it proved nothing.
func TestSharedRegistersLinearizableThroughMediatorKills(t *testing.T) {
	kills, pauseMax := 30, 600*time.Millisecond
	if testing.Short() {
		kills = 8
	}
	const regsPer = 3 // written by each side
	node := startNode(t, "--devices", "1", "--memory", "256MiB")
	meds := startKillables(t, node, 2)
	dial := func(m *killable, tenant string) *client.Client {
		c, err := client.Dial(client.Options{Socket: m.socket, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	exp, imp := dial(meds[0], "exporter"), dial(meds[1], "importer")
	const size = 2 * regsPer * 8
	p, err := exp.Malloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	s := exp.Stream()
	s.Memset(p, 0, size)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	sh, err := exp.Export(p, api.ModeCoherent, api.Grant{Tenant: "importer", Write: true})
	if err != nil {
		t.Fatal(err)
	}
	q, _, err := imp.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	var regs []*reg
	for i := range 2 * regsPer {
		w, wat, rd, rat := exp, p, imp, q // the exporter writes the first half
		if i >= regsPer {
			w, wat, rd, rat = imp, q, exp, p
		}
		off := uint64(8 * i)
		r := &reg{name: fmt.Sprintf("register %d", i), id: i, c: w, at: wat.Add(off), readAt: rat.Add(off)}
		var err error
		if r.ws, err = w.NewStream(); err == nil {
			r.rs, err = rd.NewStream()
		}
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	run := killRun(t, meds, regs, []*client.Client{exp, imp}, kills, pauseMax)
	t.Logf("%d kills (exporter's mediator %d, importer's %d) in %v: %d operations on %d registers, %d sent again after a reconnect",
		kills, run.of[0], run.of[1], run.took, run.ops, len(regs), run.resent)
	if run.resent == 0 {
		t.Fatalf("%d kills cut no operation: the test proved nothing", kills)
	}
	for _, r := range regs {
		if err := check(r.history(), r.writes); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}
}
