// Command smallop drives the small synchronous operation, or the raw
// three-process ping-pong it is judged against, in a loop, for profiling
// each alone (scripts/small-op-profile), and times the operations that
// follow an idle spell. It is a measuring tool, not part of the system.
//
//	smallop op DURATION            4-byte device→host copies and Synchronize, through $VGPU_SOCKET
//	smallop pingpong DURATION      the bench's ping-pong through its relay and echo processes
//	smallop idle GAP [spin]        rounds of 900 operations, each after GAP asleep (or spinning both CPUs)
//
// op and pingpong print the pids of the processes on the round trip (for
// op, the daemons' from scripts/with-cluster.sh's VGPU_MEDIATOR_PID and
// VGPU_NODE_PID) and the round trips' count and mean; idle prints the median time an operation of
// operations 1, 2–10, 11–100 and 101–900 after the gap, over 40 rounds.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/bench"
)

func main() {
	bench.ServePeerIfAsked() // the ping-pong's relay and echo are this binary
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "smallop:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: smallop op|pingpong DURATION, or smallop idle GAP [spin]")
	}
	d, err := time.ParseDuration(args[1])
	if err != nil || d < 0 {
		return fmt.Errorf("duration %q: want a Go duration such as 3s: %v", args[1], err)
	}
	switch args[0] {
	case "op":
		op, err := dialOp()
		if err != nil {
			return err
		}
		fmt.Printf("tenant pid %d\n", os.Getpid())
		// scripts/with-cluster.sh says where its daemons run.
		for _, d := range []string{"mediator", "node"} {
			if pid := os.Getenv("VGPU_" + strings.ToUpper(d) + "_PID"); pid != "" {
				fmt.Printf("%s pid %s\n", d, pid)
			}
		}
		return loop(d, func(n int) error {
			for range n {
				if err := op(); err != nil {
					return err
				}
			}
			return nil
		})
	case "pingpong":
		return pingPong(d)
	case "idle":
		op, err := dialOp()
		if err != nil {
			return err
		}
		return afterIdle(op, d, len(args) > 2 && args[2] == "spin")
	}
	return fmt.Errorf("unknown mode %q: want op, pingpong or idle", args[0])
}

// dialOp connects to the mediator at $VGPU_SOCKET and returns one small
// operation: a 4-byte copy from the device, then Synchronize.
func dialOp() (func() error, error) {
	c, err := client.Dial(client.Options{Socket: os.Getenv("VGPU_SOCKET"), Tenant: "bench"})
	if err != nil {
		return nil, err
	}
	p, err := c.Malloc(0, 4<<10)
	if err != nil {
		return nil, err
	}
	s := c.Stream()
	b := make([]byte, 4)
	return func() error {
		s.CopyFromDevice(b, p)
		return s.Synchronize()
	}, nil
}

// loop runs round trips for d, a thousand at a time (roundTrips(1000)),
// and prints their mean.
func loop(d time.Duration, roundTrips func(n int) error) error {
	n, start := 0, time.Now()
	for time.Since(start) < d {
		if err := roundTrips(1000); err != nil {
			return err
		}
		n += 1000
	}
	fmt.Printf("%d round trips, %.1f µs each\n", n, time.Since(start).Seconds()*1e6/float64(n))
	return nil
}

// pingPong runs the bench's ping-pong through its relay and echo
// processes (this binary again) for d.
func pingPong(d time.Duration) error {
	pp, err := bench.ProcessPingPong()
	if err != nil {
		return err
	}
	defer pp.Close()
	fmt.Printf("client pid %d\nrelay pid %d\necho pid %d\n", os.Getpid(), pp.RelayPid, pp.EchoPid)
	return loop(d, func(n int) error {
		_, err := pp.RoundTrips(n)
		return err
	})
}

// afterIdle times 40 rounds of 900 operations, each round after gap
// asleep or, with spin, with both CPUs kept busy by this process.
func afterIdle(op func() error, gap time.Duration, spin bool) error {
	const rounds, per = 40, 900
	ends := []int{1, 10, 100, per} // the last operation of each group
	times := make([][]float64, len(ends))
	for range rounds {
		if spin {
			spinFor(gap)
		} else {
			time.Sleep(gap)
		}
		last, g, prev := time.Now(), 0, 0
		for i := 1; i <= per; i++ {
			if err := op(); err != nil {
				return err
			}
			if i == ends[g] {
				now := time.Now()
				times[g] = append(times[g], now.Sub(last).Seconds()*1e6/float64(i-prev))
				last, prev = now, i
				g++
			}
		}
	}
	how := "asleep"
	if spin {
		how = "spinning both CPUs"
	}
	fmt.Printf("after %v %s, median µs an operation over %d rounds:\n", gap, how, rounds)
	prev := 0
	for g, end := range ends {
		slices.Sort(times[g])
		which := fmt.Sprintf("operations %d–%d", prev+1, end)
		if prev+1 == end {
			which = fmt.Sprintf("operation %d", end)
		}
		fmt.Printf("  %s: %.1f\n", which, times[g][len(times[g])/2])
		prev = end
	}
	return nil
}

// spinFor keeps two goroutines busy for d.
func spinFor(d time.Duration) {
	end := time.Now().Add(d)
	done := make(chan struct{})
	for range 2 {
		go func() {
			for time.Now().Before(end) {
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
}
