package e2e

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// Linearizability of coherent shared buffers, checked with porcupine on
// recorded histories: clients on three mediator processes read and write
// 8-byte registers, one per coherence page, of a buffer a fourth session
// exported; each register's history is short and checked on its own. One
// mediator is killed part way through: its clients' writes that were cut
// off may or may not have happened, which the checker allows (they never
// return), and the others go on, delayed by a lease at most.

const regPage = 64 << 10 // the node's coherence page

// regOp is a register operation's input: a write of value, or a read.
type regOp struct {
	write bool
	value uint64
}

var registerModel = porcupine.Model{
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.write {
			return true, in.value
		}
		return output.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		if in := input.(regOp); in.write {
			return fmt.Sprintf("write(%d)", in.value)
		}
		return fmt.Sprintf("read() -> %v", output)
	},
}

// history is what the clients of one register did.
type history struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

func (h *history) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// sharedRig is a node, three mediators and an exported coherent buffer of
// regs registers, imported by one client per mediator.
type sharedRig struct {
	mediators []*proc
	clients   []*client.Client
	regs      []client.Ptr // per client, the imported buffer
}

func startSharedRig(t *testing.T, regs int) *sharedRig {
	addr := freePort(t)
	startProc(t, "vgpu-node", "--listen", addr, "--devices", "1", "--memory", "256MiB", "--log-level", "warn")
	waitFor(t, "vgpu-node to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	rig := &sharedRig{}
	var sockets []string
	for i := range 3 {
		dir := t.TempDir()
		sock := filepath.Join(dir, "m.sock")
		rig.mediators = append(rig.mediators, startProc(t, "vgpu-mediator", "--socket", sock, "--node", addr,
			"--state-dir", dir, "--quota", "", "--containerd", "", "--log-level", "warn"))
		sockets = append(sockets, sock)
		waitFor(t, fmt.Sprintf("mediator %d socket", i), func() bool { _, err := os.Stat(sock); return err == nil })
	}
	owner, err := client.Dial(client.Options{Socket: sockets[0], Tenant: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	buf, err := owner.Malloc(0, uint64(regs*regPage))
	if err != nil {
		t.Fatal(err)
	}
	var grants []api.Grant
	for i := range sockets {
		grants = append(grants, api.Grant{Tenant: fmt.Sprintf("c%d", i), Write: true})
	}
	sh, err := owner.Export(buf, api.ModeCoherent, grants...)
	if err != nil {
		t.Fatal(err)
	}
	for i, sock := range sockets {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p, _, err := c.Import(sh)
		if err != nil {
			t.Fatal(err)
		}
		rig.clients = append(rig.clients, c)
		rig.regs = append(rig.regs, p)
	}
	return rig
}

// kill stops mediator i with SIGKILL, as a crash.
func (r *sharedRig) kill(i int) {
	p := r.mediators[i]
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

func TestCoherentBufferIsLinearizable(t *testing.T) {
	const (
		regs      = 1200 // one short history each
		opsPer    = 4    // per client per history
		inFlight  = 24   // histories run at once
		killAfter = 500  // histories before mediator 2 is killed
	)
	rig := startSharedRig(t, regs)
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	histories := make([]*history, regs)
	var killed sync.Once
	dead := make([]bool, len(rig.clients))
	var deadMu sync.RWMutex
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for r := range regs {
		if r == killAfter {
			wg.Wait() // the histories before the crash are complete
			killed.Do(func() {
				rig.kill(2)
				deadMu.Lock()
				dead[2] = true
				deadMu.Unlock()
			})
		}
		h := &history{}
		histories[r] = h
		for ci, c := range rig.clients {
			deadMu.RLock()
			gone := dead[ci]
			deadMu.RUnlock()
			if gone {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				clientHistory(t, c, rig.regs[ci].Add(uint64(r*regPage)), ci, r, opsPer, clock, h)
			}()
		}
		// A crash in the middle of a history: mediator 2 dies while its
		// client's operations on register killAfter+10 are under way.
		if r == killAfter+10 {
			time.Sleep(200 * time.Microsecond)
		}
	}
	wg.Wait()
	violations, checked, ops := 0, 0, 0
	for r, h := range histories {
		if len(h.ops) == 0 {
			continue
		}
		checked++
		ops += len(h.ops)
		if res := porcupine.CheckOperationsTimeout(registerModel, h.ops, 10*time.Second); res != porcupine.Ok {
			violations++
			if violations <= 3 {
				t.Errorf("register %d: history is not linearizable (%v): %+v", r, res, h.ops)
			}
		}
	}
	t.Logf("%d histories of %d operations checked, %d not linearizable, in %v", checked, ops, violations, time.Since(start))
	if checked < 1000 {
		t.Fatalf("only %d histories checked, want at least 1000", checked)
	}
}

// clientHistory runs one client's random reads and writes of a register
// and records them. A write whose outcome is unknown (its mediator died)
// is recorded as never returning; a failed read is left out.
func clientHistory(t *testing.T, c *client.Client, reg client.Ptr, ci, r, n int, clock func() int64, h *history) {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(ci)))
	s, err := c.NewStream()
	if err != nil {
		return // the mediator is gone
	}
	defer s.Destroy()
	buf := make([]byte, 8)
	for k := range n {
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		if rng.IntN(2) == 0 {
			v := uint64(r)<<32 | uint64(ci)<<16 | uint64(k+1)
			op := porcupine.Operation{ClientId: ci, Input: regOp{write: true, value: v}, Call: clock()}
			putU64(buf, v)
			s.CopyToDevice(reg, buf)
			err := s.Synchronize()
			op.Return = clock()
			if err != nil {
				if !errors.Is(err, api.ErrUnavailable) {
					t.Errorf("client %d write of register %d: %v", ci, r, err)
				}
				op.Return = math.MaxInt64
				h.add(op)
				return
			}
			h.add(op)
			continue
		}
		op := porcupine.Operation{ClientId: ci, Input: regOp{}, Call: clock()}
		s.CopyFromDevice(buf, reg)
		err := s.Synchronize()
		op.Return = clock()
		if err != nil {
			if !errors.Is(err, api.ErrUnavailable) {
				t.Errorf("client %d read of register %d: %v", ci, r, err)
			}
			return
		}
		op.Output = getU64(buf)
		h.add(op)
	}
}

func putU64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func getU64(b []byte) uint64 {
	var v uint64
	for i := range 8 {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}
