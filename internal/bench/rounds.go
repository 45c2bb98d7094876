package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Interleaved rounds. A figure taken once is at the mercy of one scheduler
// hiccup: on a 2-core host a 20 ms copy can take twice as long when a
// daemon wakes. So every timed figure is a contender in interleave: each
// is timed in windows of at least Options.Window of work (small units
// repeated within a window), the contenders take turns within a round (in
// orders that change from turn to turn, so that none is always first or
// always follows the same one: see balancedOrders), and a figure is the
// median over the rounds with the range beside it. A ratio is taken per
// round, between windows timed next to each other, then its median and
// range are reported.
//
// Within a round each window is cut into slices that alternate with the
// other contenders' slices, so that a round's figures are timed over the
// same stretch of time rather than one after the other: a slow spell of
// the host that lasts a fraction of a second (another process's burst, a
// scheduling regime that the three processes of a round trip fall into and
// out of) then weighs on every contender of the round alike instead of on
// whichever window it hit. A slice is a whole number of units, so a window
// of fewer units than slices has fewer slices.

// DefaultSlices is how many slices a window is cut into by default.
const DefaultSlices = 8

// DefaultWindow is how long a timed window lasts at least, by default.
const DefaultWindow = 500 * time.Millisecond

// maxUnits bounds a window's units, whatever the calibration says.
const maxUnits = 1 << 24

// A contender is one timed figure: run(n) does n units of its work (n
// copies, n round trips, n launches) and returns how long they took, not
// counting what it does untimed around them (checks, clearing).
type contender struct {
	name string
	run  func(n int) (time.Duration, error)
	// n is the units per window; at least min, and as calibrate sets it.
	n, min int
}

// Spread is a figure over rounds: its median and its range.
type Spread struct {
	Median, Min, Max float64
}

// spreadOf is xs's median (of an even count, the mean of the middle two)
// and range; the zero Spread for no values.
func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + m) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

// ratioSpread is the spread of a[i]/b[i], round by round: the ratio of
// two figures timed next to each other, so that a slow moment of the host
// weighs on both.
func ratioSpread(a, b []float64) Spread {
	r := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		r = append(r, ratio(a[i], b[i]))
	}
	return spreadOf(r)
}

// calibrate sets c.n so that a window of c.n units lasts about window:
// it times growing probes (the first doubles as a warm-up) until one
// lasts an eighth of the window, then scales up from it. A probe starts at
// c.n when set (a guess from a smaller size), else at 1.
func calibrate(c *contender, window time.Duration) error {
	n := max(1, c.n/8, c.min)
	for {
		d, err := c.run(n)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if d >= window/8 || n >= maxUnits {
			c.n = max(c.min, min(maxUnits, int(math.Ceil(float64(n)*float64(window)/float64(max(d, 1))))))
			return nil
		}
		grow := 16.0
		if d > 0 {
			grow = min(grow, float64(window)/8/float64(d)*1.5)
		}
		n = min(maxUnits, max(n+1, int(float64(n)*grow)))
	}
}

// schedule is how interleave times its contenders: rounds rounds, each
// contender's window of at least window cut into slices slices.
type schedule struct {
	rounds, slices int
	window         time.Duration
	log            io.Writer // if set, a line for each slice timed (Options.SliceLog)
	part           string    // what the contenders are part of, for log
}

// interleave calibrates each contender for sc.window, then runs sc.rounds
// rounds of slices turns: in turn t (round i, slice s: t = i·slices + s)
// the contenders run in balancedOrders' (t mod its length)th order, each
// its share of its window's units. It returns each contender's rate (units
// per second) in each round, its window's units over the time of its
// slices, indexed as cs. With sc.log set, it writes a line there for each
// slice timed: sc.part, round, contender, the contender that ran just
// before it ("-" for none), units and seconds, tab-separated.
func interleave(cs []*contender, sc schedule) ([][]float64, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	for _, c := range cs {
		if err := calibrate(c, sc.window); err != nil {
			return nil, err
		}
	}
	slices := max(1, sc.slices)
	orders := balancedOrders(len(cs))
	rates := make([][]float64, len(cs))
	took := make([]time.Duration, len(cs))
	done := make([]int, len(cs))
	before := "-"
	for i := range sc.rounds {
		clear(took)
		clear(done)
		for s := range slices {
			for _, k := range orders[(i*slices+s)%len(orders)] {
				c := cs[k]
				n := c.n*(s+1)/slices - done[k] // the units up to this slice's end, less those run
				if n == 0 {
					continue
				}
				d, err := c.run(n)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", c.name, err)
				}
				took[k] += d
				done[k] += n
				if sc.log != nil {
					fmt.Fprintf(sc.log, "%s\t%d\t%s\t%s\t%d\t%.9f\n", sc.part, i, c.name, before, n, d.Seconds())
				}
				before = c.name
			}
		}
		for k, c := range cs {
			rates[k] = append(rates[k], float64(c.n)/max(took[k], 1).Seconds())
		}
	}
	return rates, nil
}

// scaled is xs each times f.
func scaled(xs []float64, f float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * f
	}
	return out
}

// balancedOrders is the orders in which interleave's contenders take
// their turns: in each order every contender runs once, over all of them
// each runs right after each other one equally often, and run one after
// another, each order starts with the contender the one before ended
// with, which then simply runs on. A contender's time depends on the one
// before it: what that one left behind (the CPUs busy or idle, the other
// processes asleep, caches and collections) carries over. In one cycle
// rotated from turn to turn each contender would nearly always follow the
// same one, and a figure would carry that neighbour's leavings alone: in
// `vgpuctl bench` the small operation followed the in-process ping-pong,
// and the ping-pong it is judged against followed the launches (#25).
//
// An odd n takes Williams' design, a balanced Latin square, and its
// reverses: 2n orders, each pair twice. An even n's Williams orders cannot
// be chained (each runs from r to r+n/2), so up to maxSearched contenders
// chainedOrders searches for n orders, or else 2n; beyond, the Williams
// orders are run unchained, and at their joins each contender follows one
// other once more in n turns.
func balancedOrders(n int) [][]int {
	if n%2 == 0 && n <= maxSearched {
		for _, m := range []int{n, 2 * n} {
			if o := chainedOrders(n, m); o != nil {
				return o
			}
		}
	}
	// The first order is 0, 1, n-1, 2, n-2, ...; the others add r
	// modulo n, so that each step between neighbours (+1, -2, +3, ...)
	// is taken once from every contender.
	first := make([]int, n)
	for j := 1; j < n; j++ {
		if j%2 == 1 {
			first[j] = (j + 1) / 2
		} else {
			first[j] = n - j/2
		}
	}
	order := func(r int) []int {
		o := make([]int, n)
		for j, c := range first {
			o[j] = (c + r) % n
		}
		return o
	}
	if n%2 == 0 {
		orders := make([][]int, n)
		for r := range orders {
			orders[r] = order(r)
		}
		return orders
	}
	// Order r runs from r to r+f (f = first[n-1], and 2f = n+1): taking
	// r = 0, f, 2f, ... chains all n back to 0, and their reverses, taken
	// from r = -f down by f, chain back to 0 too.
	f := first[n-1]
	orders := make([][]int, 0, 2*n)
	for i := range n {
		orders = append(orders, order(i*f%n))
	}
	for i := range n {
		o := order(((-(i+1)*f)%n + n) % n)
		slices.Reverse(o)
		orders = append(orders, o)
	}
	return orders
}

// maxSearched is the most contenders chainedOrders is asked for: it takes
// microseconds up to 6 (what interleave's callers have) and a fifth of a
// second for 8.
const maxSearched = 6

// chainedOrders searches, depth first, for m orders of n contenders in
// which each ordered pair of different contenders is neighbours m/n times,
// each order starting with the contender the one before ended with and
// the last ending where the first starts; nil if there are none.
func chainedOrders(n, m int) [][]int {
	want := m / n
	pairs := make([]int, n*n) // pairs[a*n+b]: times b has followed a
	used := make([]bool, n)
	orders := [][]int{}
	cur := make([]int, 0, n)
	var extend func() bool
	// extend grows cur, the order being built, then the orders after it.
	extend = func() bool {
		if len(cur) == n {
			last := cur[n-1]
			if len(orders)+1 == m {
				if last != orders[0][0] {
					return false
				}
				orders = append(orders, slices.Clone(cur))
				return true
			}
			orders = append(orders, slices.Clone(cur))
			saved, savedUsed := slices.Clone(cur), slices.Clone(used)
			cur = append(cur[:0], last)
			clear(used)
			used[last] = true
			if extend() {
				return true
			}
			orders = orders[:len(orders)-1]
			cur, used = saved, savedUsed
			return false
		}
		prev := cur[len(cur)-1]
		for x := range n {
			if used[x] || pairs[prev*n+x] == want {
				continue
			}
			pairs[prev*n+x]++
			used[x] = true
			cur = append(cur, x)
			if extend() {
				return true
			}
			cur = cur[:len(cur)-1]
			used[x] = false
			pairs[prev*n+x]--
		}
		return false
	}
	cur = append(cur, 0)
	used[0] = true
	if extend() {
		return orders
	}
	return nil
}
