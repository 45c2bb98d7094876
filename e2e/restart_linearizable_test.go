package e2e

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/linearize"
)

// Registers through mediator kills: the coherence test's rig (three
// mediator processes on one node, porcupine over per-register histories,
// internal/linearize) with a mediator SIGKILLed at random points — 50
// kills, spread at random over the three — and started again each time on
// the same state directory, while tenants go on reading and writing.
//
// What is checked, and why so. The registers here are private (those of
// TestSharedRegistersLinearizableThroughMediatorKills are in a shared
// buffer, across two mediators): each session holds a few 8-byte registers,
// each read and written concurrently through its own streams by one writer
// and one reader. One writer per register because a write the SDK repeats
// after a reconnect (an inline copy to the device is safe to send again:
// client/reconnect.go) is at-least-once: with two writers, a repeat could
// land after the other writer's acknowledged write and undo it, which no
// register allows and the SDK does not promise. With one writer, a repeat
// writes the value the register already holds or is about to. Half the
// writes go through a device-to-device copy from a scratch buffer, which
// the SDK must not repeat: cut by a kill, they fail with
// client.ErrInterrupted, and the history records them as never returning
// (porcupine may place them anywhere after their call, or nowhere: their
// outcome is unknown). Reads cut by a kill are repeated by the SDK and
// must then return a value the register held during the call.
//
// Each register's history ends with a read after the last kill, and must
// be linearizable; besides, that read must return the register's last
// acknowledged write or one of the unknown writes after it: no
// acknowledged write is lost. The test also checks that the kills cut
// operations (requests sent again, and writes interrupted), else it
// proved nothing, and that the checker catches a history doctored to lose an
// acknowledged write.
func TestRegistersLinearizableThroughMediatorKills(t *testing.T) {
	kills, pauseMax := 50, 700*time.Millisecond
	if testing.Short() {
		kills = 10
	}
	const sessionsPer, regsPer = 2, 3
	node := startNode(t, "--devices", "1", "--memory", "256MiB")
	meds := startKillables(t, node, 3)

	var regs []*reg
	var clients []*client.Client
	for mi, m := range meds {
		for si := range sessionsPer {
			c, err := client.Dial(client.Options{Socket: m.socket, Tenant: fmt.Sprintf("m%d-s%d", mi, si)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			clients = append(clients, c)
			buf, err := c.Malloc(0, 2*8*regsPer) // registers, then one scratch word per register
			if err != nil {
				t.Fatal(err)
			}
			s := c.Stream()
			s.Memset(buf, 0, 2*8*regsPer)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			for ri := range regsPer {
				r := &reg{name: fmt.Sprintf("mediator %d session %d register %d", mi, si, ri), id: len(regs),
					c: c, at: buf.Add(uint64(8 * ri)), scratch: buf.Add(uint64(8 * (regsPer + ri)))}
				for _, role := range []string{"writer", "reader"} {
					st, err := c.NewStream()
					if err != nil {
						t.Fatal(err)
					}
					if role == "writer" {
						r.ws = st
					} else {
						r.rs = st
					}
				}
				regs = append(regs, r)
			}
		}
	}
	run := killRun(t, meds, regs, clients, kills, pauseMax)
	var interrupted uint64
	for _, r := range regs {
		interrupted += r.interrupted
	}
	resent := run.resent
	t.Logf("%d kills in %v: %d operations on %d registers, %d sent again after a reconnect, %d interrupted (unknown outcome)",
		kills, run.took, run.ops, len(regs), resent, interrupted)
	// Both ways a kill cuts an operation must have happened, or the test
	// proved nothing about them.
	if resent == 0 || interrupted == 0 {
		t.Fatalf("%d kills cut %d repeatable operations and %d unrepeatable ones: want some of each", kills, resent, interrupted)
	}
	for _, r := range regs {
		if err := check(r.history(), r.writes); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}

	// A planted bug: the checker must catch a lost acknowledged write. Take
	// a register whose history acknowledged two writes of different values,
	// and make its final read return the older one.
	planted := false
	for _, r := range regs {
		h, ws := r.history(), r.writes
		last, prev := -1, -1
		for i := len(ws) - 1; i >= 0 && prev < 0; i-- {
			if ws[i].acked {
				if last < 0 {
					last = i
				} else if ws[i].value != ws[last].value {
					prev = i
				}
			}
		}
		if prev < 0 {
			continue
		}
		// Writes after the last acknowledged one were interrupted: drop
		// them, so that only losing the write explains the doctored read.
		ws = ws[:last+1]
		var doctored []porcupine.Operation
		for _, o := range h {
			if o.Return != math.MaxInt64 {
				doctored = append(doctored, o)
			}
		}
		doctored[len(doctored)-1].Output = ws[prev].value
		if err := check(doctored, ws); err == nil {
			t.Fatalf("%s: a history whose final read lost write %#x passed the checker", r.name, ws[last].value)
		}
		if porcupine.CheckOperations(linearize.Model, doctored) {
			t.Fatalf("%s: porcupine found linearizable a history whose final read lost write %#x", r.name, ws[last].value)
		}
		planted = true
		break
	}
	if !planted {
		t.Fatal("no register acknowledged two writes: nothing to plant the bug in")
	}
}

// killed is what killRun did.
type killed struct {
	ops    uint64        // operations on the registers
	resent uint64        // requests sent again after a reconnect
	of     []int         // kills of each mediator
	took   time.Duration // from the workload's start to its end
}

// killRun runs each register's writer and reader, of clients, while
// mediators are SIGKILLed kills times, each at a random point of the
// workload and a random one of meds (each at least once, if kills allow),
// and started again on its state directory; then it reads each register
// once more, after every kill. Any error of the workload fails the test.
func killRun(t *testing.T, meds []*killable, regs []*reg, clients []*client.Client, kills int, pauseMax time.Duration) killed {
	t.Helper()
	base := make([]uint64, len(clients))
	for i, c := range clients {
		base[i] = c.Requests()
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(regs))
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	for _, r := range regs {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- r.write(&stop, clock) }()
		go func() { defer wg.Done(); errs <- r.read(&stop, clock) }()
	}

	// The kills, from the test's goroutine: each at a random point of the
	// workload, of a random mediator, which comes back on its state.
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 22))
	t.Logf("kill schedule seed %d", seed)
	run := killed{of: make([]int, len(meds))}
	for k := range kills {
		time.Sleep(time.Duration(rng.Int64N(int64(pauseMax))))
		i := rng.IntN(len(meds))
		if k < len(meds) {
			i = k
		}
		meds[i].kill()
		meds[i].start()
		run.of[i]++
	}
	time.Sleep(200 * time.Millisecond) // operations after the last restart
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The final read of each register, once every kill is over.
	for _, r := range regs {
		if err := r.readOnce(r.rs, clock); err != nil {
			t.Fatalf("%s: final read: %v", r.name, err)
		}
	}
	run.took = time.Since(start).Round(time.Millisecond)
	var sent uint64
	for _, r := range regs {
		run.ops += r.nops
	}
	for i, c := range clients {
		sent += c.Requests() - base[i]
	}
	// One request per operation; a read or copy batch cut by a kill and
	// sent again is one more.
	run.resent = sent - run.ops
	return run
}

// startKillables starts n vgpu-mediator processes in front of node, each
// with a state directory of its own.
func startKillables(t *testing.T, node string, n int) []*killable {
	meds := make([]*killable, n)
	for i := range meds {
		dir := t.TempDir()
		meds[i] = &killable{t: t, node: node, dir: dir, socket: filepath.Join(dir, "m.sock")}
		meds[i].start()
	}
	return meds
}

// killable is a vgpu-mediator process that the test SIGKILLs and starts
// again on the same socket and state directory.
type killable struct {
	t                 *testing.T
	node, dir, socket string
	flags             []string // more flags of vgpu-mediator
	p                 *proc
}

func (k *killable) start() {
	k.t.Helper()
	k.p = startProc(k.t, "vgpu-mediator", append([]string{"--socket", k.socket, "--node", k.node, "--state-dir", k.dir,
		"--quota", "", "--containerd", "", "--log-level", "warn"}, k.flags...)...)
	waitFor(k.t, "vgpu-mediator to serve", func() bool {
		c, err := net.Dial("unix", k.socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (k *killable) kill() {
	k.t.Helper()
	if err := k.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		k.t.Fatal(err)
	}
	k.p.cmd.Wait()
}

// reg is an 8-byte word of device memory in one session, written by
// one goroutine on stream ws and read by another on stream rs.
type reg struct {
	name        string
	id          int
	c           *client.Client
	at, scratch client.Ptr // scratch 0: every write is an inline copy
	ws, rs      *client.Stream
	// readAt is where rs reads the register, if not at: the reader's
	// import of a shared buffer the writer exported, or the other way.
	readAt client.Ptr

	mu          sync.Mutex
	ops         []porcupine.Operation // guarded by mu
	writes      []write               // in order; only the writer appends
	interrupted uint64                // writes that failed with ErrInterrupted; the writer's
	nops        uint64                // guarded by mu
}

// write is a write of value, and whether it was acknowledged.
type write struct {
	value uint64
	acked bool
}

func (r *reg) add(o porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}

func (r *reg) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

func word(v uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return b
}

// write writes distinct values until stop, alternating at random between
// an inline copy (repeatable) and a copy through scratch (not).
func (r *reg) write(stop *atomic.Bool, clock func() int64) error {
	rng := rand.New(rand.NewPCG(uint64(r.id), 1))
	for k := uint64(1); !stop.Load(); k++ {
		v := uint64(r.id+1)<<32 | k
		o := porcupine.Operation{ClientId: 2 * r.id, Input: linearize.Write(v), Call: clock()}
		if r.scratch == 0 || rng.IntN(2) == 0 {
			r.ws.CopyToDevice(r.at, word(v))
		} else {
			r.ws.CopyToDevice(r.scratch, word(v))
			r.ws.CopyDevice(r.at, r.scratch, 8)
		}
		err := r.ws.Synchronize()
		o.Return = clock()
		r.count()
		switch {
		case err == nil:
			r.writes = append(r.writes, write{v, true})
		case errors.Is(err, client.ErrInterrupted):
			o.Return = math.MaxInt64 // it may or may not have happened
			r.writes = append(r.writes, write{v, false})
			r.interrupted++
		default:
			return fmt.Errorf("%s: write %#x: %w", r.name, v, err)
		}
		r.add(o)
		time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
	}
	return nil
}

func (r *reg) count() {
	r.mu.Lock()
	r.nops++
	r.mu.Unlock()
}

// read reads until stop.
func (r *reg) read(stop *atomic.Bool, clock func() int64) error {
	rng := rand.New(rand.NewPCG(uint64(r.id), 2))
	for !stop.Load() {
		if err := r.readOnce(r.rs, clock); err != nil {
			return fmt.Errorf("%s: read: %w", r.name, err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
	}
	return nil
}

func (r *reg) readOnce(s *client.Stream, clock func() int64) error {
	b := make([]byte, 8)
	o := porcupine.Operation{ClientId: 2*r.id + 1, Input: linearize.Read(), Call: clock()}
	at := r.at
	if r.readAt != 0 {
		at = r.readAt
	}
	s.CopyFromDevice(b, at)
	err := s.Synchronize()
	o.Return = clock()
	r.count()
	if err != nil {
		return err // a read is repeated after a reconnect: it must not fail
	}
	var v uint64
	for i := range b {
		v |= uint64(b[i]) << (8 * i)
	}
	o.Output = v
	r.add(o)
	return nil
}

// check checks a register's history, whose last operation is a read after
// every other one ended, against its writes in order: it must be
// linearizable, and that read must return the last acknowledged write or
// one of the unknown writes after it.
func check(h []porcupine.Operation, ws []write) error {
	final := h[len(h)-1].Output.(uint64)
	ok := true
	last := -1
	for i, w := range ws {
		if w.acked {
			last = i
		}
	}
	if last >= 0 {
		ok = false
		for _, w := range ws[last:] {
			if w.value == final {
				ok = true
			}
		}
	}
	if !ok {
		return fmt.Errorf("acknowledged write %#x lost: the final read returned %#x", ws[last].value, final)
	}
	if res := porcupine.CheckOperationsTimeout(linearize.Model, h, 20*time.Second); res != porcupine.Ok {
		return fmt.Errorf("history of %d operations is not linearizable (%v)", len(h), res)
	}
	return nil
}
