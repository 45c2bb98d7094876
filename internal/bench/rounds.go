package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Interleaved rounds. A figure taken once is at the mercy of one scheduler
// hiccup: on a 2-core host a 20 ms copy can take twice as long when a
// daemon wakes. So every timed figure is a contender in interleave: each
// is timed in windows of at least Options.Window of work (small units
// repeated within a window), the contenders take turns within a round (the
// order rotating from round to round, so that none is always first or
// always follows the same one), and a figure is the median over the rounds
// with the range beside it. A ratio is taken per round, between windows
// timed next to each other, then its median and range are reported.
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
}

// interleave calibrates each contender for sc.window, then runs sc.rounds
// rounds: in round i, slice s, the contenders take turns starting from the
// ((i+s) mod len)th, each running its share of its window's units. It
// returns each contender's rate (units per second) in each round, its
// window's units over the time of its slices, indexed as cs.
func interleave(cs []*contender, sc schedule) ([][]float64, error) {
	for _, c := range cs {
		if err := calibrate(c, sc.window); err != nil {
			return nil, err
		}
	}
	slices := max(1, sc.slices)
	rates := make([][]float64, len(cs))
	took := make([]time.Duration, len(cs))
	done := make([]int, len(cs))
	for i := range sc.rounds {
		clear(took)
		clear(done)
		for s := range slices {
			for j := range cs {
				k := (i + s + j) % len(cs)
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
