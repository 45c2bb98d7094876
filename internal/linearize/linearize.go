// Package linearize records histories of reads and writes of a coherent
// shared buffer made by clients of several mediators, and checks each with
// the porcupine linearizability checker. Tests use it on loopback (e2e/)
// and across network namespaces (e2e/root/).
//
// The buffer is an array of 8-byte registers, one per coherence page, so
// that each register's history is independent of the others and short
// enough to check exhaustively. A client whose mediator dies mid-operation
// records a write it could not finish as never returning (it may or may
// not have happened), and a read it could not finish not at all.
package linearize

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// PageSize is the distance between registers: the nodes' coherence page.
const PageSize = 64 << 10

// op is a register operation's input: a write of value, or a read.
type op struct {
	write bool
	value uint64
}

// Write is the input of an operation that wrote v to a register, for
// histories recorded outside Run (e2e's kill-and-restart test).
func Write(v uint64) any { return op{write: true, value: v} }

// Read is the input of an operation that read a register; its output is
// the uint64 it read.
func Read() any { return op{} }

// Model is a register that starts at zero.
var Model = porcupine.Model{
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(op)
		if in.write {
			return true, in.value
		}
		return output.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		if in := input.(op); in.write {
			return fmt.Sprintf("write(%d)", in.value)
		}
		return fmt.Sprintf("read() -> %v", output)
	},
}

// Rig is a shared coherent buffer of registers and one client per
// mediator that imported it.
type Rig struct {
	Clients []*client.Client
	Regs    []client.Ptr // per client, where the buffer is
	owner   *client.Client
}

// noReconnect is the rig's clients' Options.Reconnect: a mediator the rig
// kills (Options.Kill) stays dead, so its clients fail their calls at once,
// unavailable, rather than wait out a window to resume the session.
const noReconnect = -1

// Setup exports a buffer of regs registers from a session "owner" on the
// first socket, with write grants to tenants "c0", "c1"…, and imports it in
// a session of each on its socket.
func Setup(sockets []string, regs int) (*Rig, error) {
	owner, err := client.Dial(client.Options{Socket: sockets[0], Tenant: "owner", Reconnect: noReconnect})
	if err != nil {
		return nil, err
	}
	rig := &Rig{owner: owner}
	buf, err := owner.Malloc(0, uint64(regs*PageSize))
	if err != nil {
		rig.Close()
		return nil, err
	}
	var grants []api.Grant
	for i := range sockets {
		grants = append(grants, api.Grant{Tenant: fmt.Sprintf("c%d", i), Write: true})
	}
	sh, err := owner.Export(buf, api.ModeCoherent, grants...)
	if err != nil {
		rig.Close()
		return nil, err
	}
	for i, sock := range sockets {
		c, err := client.Dial(client.Options{Socket: sock, Tenant: fmt.Sprintf("c%d", i), Reconnect: noReconnect})
		if err != nil {
			rig.Close()
			return nil, err
		}
		rig.Clients = append(rig.Clients, c)
		p, _, err := c.Import(sh)
		if err != nil {
			rig.Close()
			return nil, err
		}
		rig.Regs = append(rig.Regs, p)
	}
	return rig, nil
}

// Close ends the rig's sessions.
func (r *Rig) Close() {
	for _, c := range r.Clients {
		c.Close()
	}
	r.owner.Close()
}

// Options size a run.
type Options struct {
	Registers int // histories, one per register
	Ops       int // per client per history
	InFlight  int // histories run at once
	// Kill, if set, is called when history KillAfter is about to start,
	// while earlier ones are still under way, to kill the mediator of
	// client KillClient, which takes no part in later histories.
	Kill       func()
	KillAfter  int
	KillClient int
	// MaxPause bounds a random pause before each operation.
	MaxPause time.Duration
}

// Result is what a run found.
type Result struct {
	Histories, Ops, Violations int
	Example                    string // one violating history, if any
	Elapsed                    time.Duration
}

type history struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

func (h *history) add(o porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

// Run records opt.Registers histories and checks each. Errors other than
// a dead mediator's (api.ErrUnavailable) are returned with the result.
func Run(rig *Rig, opt Options) (Result, error) {
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	hs := make([]*history, opt.Registers)
	dead := make([]bool, len(rig.Clients))
	sem := make(chan struct{}, max(1, opt.InFlight))
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	for r := range opt.Registers {
		if opt.Kill != nil && r == opt.KillAfter {
			opt.Kill() // operations of the histories in flight are cut off
			dead[opt.KillClient] = true
		}
		hs[r] = &history{}
		for ci, c := range rig.Clients {
			if dead[ci] {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := client1(c, rig.Regs[ci].Add(uint64(r*PageSize)), ci, r, opt, clock, hs[r]); err != nil {
					errMu.Lock()
					errs = append(errs, err)
					errMu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	var res Result
	for r, h := range hs {
		if len(h.ops) == 0 {
			continue
		}
		res.Histories++
		res.Ops += len(h.ops)
		if porcupine.CheckOperationsTimeout(Model, h.ops, 10*time.Second) != porcupine.Ok {
			res.Violations++
			if res.Example == "" {
				res.Example = fmt.Sprintf("register %d: %+v", r, h.ops)
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, errors.Join(errs...)
}

// client1 runs one client's random reads and writes of a register.
func client1(c *client.Client, reg client.Ptr, ci, r int, opt Options, clock func() int64, h *history) error {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(ci)))
	s, err := c.NewStream()
	if err != nil {
		return nil // the mediator is gone
	}
	defer s.Destroy()
	buf := make([]byte, 8)
	for k := range opt.Ops {
		if opt.MaxPause > 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(opt.MaxPause))))
		}
		if rng.IntN(2) == 0 {
			v := uint64(r)<<32 | uint64(ci)<<16 | uint64(k+1)
			o := porcupine.Operation{ClientId: ci, Input: op{write: true, value: v}, Call: clock()}
			for i := range 8 {
				buf[i] = byte(v >> (8 * i))
			}
			s.CopyToDevice(reg, buf)
			err := s.Synchronize()
			o.Return = clock()
			if err != nil {
				o.Return = math.MaxInt64 // it may yet have happened
				h.add(o)
				return unexpected(err, ci, r)
			}
			h.add(o)
			continue
		}
		o := porcupine.Operation{ClientId: ci, Input: op{}, Call: clock()}
		s.CopyFromDevice(buf, reg)
		err := s.Synchronize()
		o.Return = clock()
		if err != nil {
			return unexpected(err, ci, r)
		}
		var v uint64
		for i := range 8 {
			v |= uint64(buf[i]) << (8 * i)
		}
		o.Output = v
		h.add(o)
	}
	return nil
}

// unexpected is err unless it says the mediator is unavailable (killed).
func unexpected(err error, ci, r int) error {
	if errors.Is(err, api.ErrUnavailable) {
		return nil
	}
	return fmt.Errorf("client %d, register %d: %w", ci, r, err)
}
