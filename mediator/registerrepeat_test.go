package mediator_test

import (
	"os"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// TestRegisterRepeatedIsAnsweredAsTheFirst: a runtime hook whose
// connection was lost before the answer (an upgrade's handover) registers
// again. The same container with its same init process and the same asks
// is answered as the first was, reserving nothing more; a registration of
// that id that asks otherwise, or for another process, is still refused.
func TestRegisterRepeatedIsAnsweredAsTheFirst(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	reg := api.Register{Container: "rep", Namespace: "moby", Memory: 8 << 20, Devices: 1, Pid: uint32(os.Getpid())}
	first, err := op.Register(reg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := op.Register(reg)
	if err != nil || *again != *first {
		t.Fatalf("the same registration again: %+v, %v; want %+v", again, err, first)
	}
	if ti := tenantInfo(t, op, "team-a"); ti.Reserved != 8<<20 {
		t.Fatalf("team-a reserves %d after a repeated registration, want %d", ti.Reserved, 8<<20)
	}
	other := reg
	other.Memory = 16 << 20
	if _, err := op.Register(other); err == nil {
		t.Fatal("a registration of the same id asking for other memory was answered as a repeat")
	}
	other = reg
	other.Pid = 1
	if _, err := op.Register(other); err == nil {
		t.Fatal("a registration of the same id for another process was answered as a repeat")
	}
}
