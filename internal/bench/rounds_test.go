package bench

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

func TestSpreadOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Spread
	}{
		{nil, Spread{}},
		{[]float64{3}, Spread{3, 3, 3}},
		{[]float64{5, 1, 3}, Spread{3, 1, 5}},
		{[]float64{4, 1, 2, 10}, Spread{3, 1, 10}}, // even: the mean of the middle two
		{[]float64{2, 9, 2, 7, 1}, Spread{2, 1, 9}},
	} {
		in := slices.Clone(c.in)
		if got := spreadOf(c.in); got != c.want {
			t.Errorf("spreadOf(%v) = %+v, want %+v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("spreadOf reordered its argument: %v", c.in)
		}
	}
}

// A ratio is taken round by round, so a round in which the host was slow
// for both sides does not show as a swing.
func TestRatioSpreadPairsRounds(t *testing.T) {
	sys := []float64{100, 50, 200, 90, 110}
	base := []float64{100, 50, 200, 100, 100}
	got := ratioSpread(sys, base)
	if got != (Spread{Median: 1, Min: 0.9, Max: 1.1}) {
		t.Errorf("ratioSpread = %+v, want median 1 in [0.9, 1.1]", got)
	}
	// The ratio of the medians would say the same here; with rounds that
	// disagree, only pairing keeps the range honest.
	if r := ratioSpread([]float64{1, 2}, []float64{0, 2}); r.Min != 0 || r.Max != 1 {
		t.Errorf("a missing baseline counts as ratio 0: %+v", r)
	}
}

// fakeWork is a contender whose work takes per units of time each,
// recorded without sleeping.
type fakeWork struct {
	name  string
	per   time.Duration
	order *[]string
	calls []int
}

func (f *fakeWork) contender() *contender {
	return &contender{name: f.name, run: func(n int) (time.Duration, error) {
		*f.order = append(*f.order, f.name)
		f.calls = append(f.calls, n)
		return time.Duration(n) * f.per, nil
	}}
}

// Each contender is calibrated to windows of at least the window, then
// the contenders take turns in balancedOrders' orders, one a round here,
// and the rates come back in the contenders' order.
func TestInterleave(t *testing.T) {
	var order []string
	a := &fakeWork{name: "a", per: 2 * time.Microsecond, order: &order}
	b := &fakeWork{name: "b", per: 300 * time.Millisecond, order: &order}
	c := &fakeWork{name: "c", per: 10 * time.Millisecond, order: &order}
	cs := []*contender{a.contender(), b.contender(), c.contender()}
	cs[2].min = 100
	const window = 500 * time.Millisecond
	rates, err := interleave(cs, schedule{rounds: 5, slices: 1, window: window})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range []*fakeWork{a, b, c} {
		n := cs[i].n
		if d := time.Duration(n) * f.per; d < window || (cs[i].min < n && d > 2*window) {
			t.Errorf("%s: %d units per window, %v of work; want at least %v and at most twice", f.name, n, d, window)
		}
		if got := f.calls[len(f.calls)-5:]; !slices.Equal(got, []int{n, n, n, n, n}) {
			t.Errorf("%s: timed windows of %v units, want 5 of %d", f.name, got, n)
		}
		if len(rates[i]) != 5 || rates[i][0] != 1/f.per.Seconds() {
			t.Errorf("%s: rates %v, want 5 of %v", f.name, rates[i], 1/f.per.Seconds())
		}
	}
	if cs[2].n != 100 {
		t.Errorf("c: %d units per window, want its minimum 100", cs[2].n)
	}
	// b's one unit is over a window's eighth: a single probe.
	if b.calls[0] != 1 || len(b.calls) != 6 {
		t.Errorf("b calibrated with %v", b.calls)
	}
	timed := order[len(order)-15:]
	want := []string{"a", "b", "c", "c", "a", "b", "b", "c", "a", "a", "c", "b", "b", "a", "c"}
	if !slices.Equal(timed, want) {
		t.Errorf("rounds ran %v, want %v", timed, want)
	}
}

// With slices, a round runs each window in that many slices of whole
// units, the contenders' slices taking turns (in the next order from
// slice to slice); a window of fewer units than slices has fewer slices,
// and a rate is the window's units over its slices' time.
func TestInterleaveSlices(t *testing.T) {
	var order []string
	a := &fakeWork{name: "a", per: time.Millisecond, order: &order}
	b := &fakeWork{name: "b", per: 300 * time.Millisecond, order: &order}
	cs := []*contender{a.contender(), b.contender()}
	cs[0].min = 10 // calibrated to 500 units: 10 is less
	rates, err := interleave(cs, schedule{rounds: 2, slices: 4, window: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if cs[0].n != 500 || cs[1].n != 2 {
		t.Fatalf("units per window %d and %d, want 500 and 2", cs[0].n, cs[1].n)
	}
	// Slices run a then b, b then a, in turn; b's 2 units go in slices 1
	// and 3 of each round.
	want := []string{"a", "b", "a", "a", "b", "a", "a", "b", "a", "a", "b", "a"}
	if timed := order[len(order)-len(want):]; !slices.Equal(timed, want) {
		t.Errorf("slices ran %v, want %v", timed, want)
	}
	if got := a.calls[len(a.calls)-8:]; !slices.Equal(got, []int{125, 125, 125, 125, 125, 125, 125, 125}) {
		t.Errorf("a's slices %v", got)
	}
	if got := b.calls[len(b.calls)-4:]; !slices.Equal(got, []int{1, 1, 1, 1}) {
		t.Errorf("b's slices %v", got)
	}
	for i, f := range []*fakeWork{a, b} {
		if len(rates[i]) != 2 || rates[i][0] != 1/f.per.Seconds() {
			t.Errorf("%s: rates %v, want 2 of %v", f.name, rates[i], 1/f.per.Seconds())
		}
	}
}

// In every balanced order each contender runs once, and over the orders
// each runs right after each other one equally often; run one after
// another (the last before the first again), each order starts with the
// contender the one before ended with, but for the Williams orders of an
// even count beyond maxSearched.
func TestBalancedOrders(t *testing.T) {
	for n := 1; n <= maxSearched+2; n++ {
		orders := balancedOrders(n)
		chained := n%2 == 1 || n <= maxSearched
		after := map[[2]int]int{}
		for i, o := range orders {
			if s := slices.Sorted(slices.Values(o)); len(s) != n || s[0] != 0 || s[n-1] != n-1 || len(slices.Compact(s)) != n {
				t.Fatalf("n=%d: order %v does not run each contender once", n, o)
			}
			if next := orders[(i+1)%len(orders)]; chained && next[0] != o[n-1] {
				t.Errorf("n=%d: order %v ends with %d, the next (%v) starts with %d", n, o, o[n-1], next, next[0])
			}
			for j := 1; j < n; j++ {
				after[[2]int{o[j-1], o[j]}]++
			}
		}
		if len(orders)%n != 0 {
			t.Fatalf("n=%d: %d orders", n, len(orders))
		}
		for a := range n {
			for b := range n {
				if a != b && after[[2]int{a, b}] != len(orders)/n {
					t.Errorf("n=%d: %d runs right after %d %d times, want %d (%v)", n, b, a, after[[2]int{a, b}], len(orders)/n, orders)
				}
			}
		}
	}
}

// carryover is work whose slice takes half as long again when it runs
// right after slow's: what slow leaves behind (idle CPUs, asleep
// processes, a collection's debt) weighs on whoever follows it.
type carryover struct {
	last, slow string
}

func (c *carryover) contender(name string) *contender {
	return &contender{name: name, run: func(n int) (time.Duration, error) {
		d := time.Duration(n) * time.Millisecond
		if c.last == c.slow {
			d = d * 3 / 2
		}
		c.last = name
		return d, nil
	}}
}

// Contenders of the same work beside one that slows its follower (s)
// keep ratios of 1 among themselves: each follows s as often as another
// does. In the cycle rotated from turn to turn (s a b, a b s, b s a) a
// would follow s twice as often as b.
func TestInterleaveBalancesCarryover(t *testing.T) {
	for _, n := range []int{3, 4, 6} {
		w := &carryover{slow: "s"}
		var cs []*contender
		for _, name := range []string{"s", "a", "b", "c", "d", "e"}[:n] {
			c := w.contender(name)
			c.n, c.min = 600, 600 // calibrated already
			cs = append(cs, c)
		}
		// Each round runs every order once.
		rates, err := interleave(cs, schedule{rounds: 3, slices: len(balancedOrders(n)), window: 600 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for i := 2; i < n; i++ {
			if r := ratioSpread(rates[i], rates[1]); r.Min < 0.99 || r.Max > 1.01 {
				t.Errorf("%d contenders: rate of %s over %s's %+v, want 1 in every round", n, cs[i].name, cs[1].name, r)
			}
		}
	}
}

// The slice log has a line for each slice timed, naming the contender
// timed just before it; calibration's probes are not logged.
func TestInterleaveSliceLog(t *testing.T) {
	var order []string
	a := &fakeWork{name: "a", per: time.Millisecond, order: &order}
	b := &fakeWork{name: "b", per: 2 * time.Millisecond, order: &order}
	cs := []*contender{a.contender(), b.contender()}
	cs[0].n, cs[1].n = 400, 200
	var log strings.Builder
	if _, err := interleave(cs, schedule{rounds: 1, slices: 2, window: 400 * time.Millisecond, log: &log, part: "p"}); err != nil {
		t.Fatal(err)
	}
	want := "p\t0\ta\t-\t200\t0.200000000\n" +
		"p\t0\tb\ta\t100\t0.200000000\n" +
		"p\t0\tb\tb\t100\t0.200000000\n" +
		"p\t0\ta\tb\t200\t0.200000000\n"
	if log.String() != want {
		t.Errorf("slice log\n%s\nwant\n%s", log.String(), want)
	}
}

// slowSpell is work on a simulated clock whose units take twice as long
// while the clock is in [from, to): a slow spell of the host.
type slowSpell struct {
	now, from, to time.Duration
}

func (c *slowSpell) contender(name string, per time.Duration) *contender {
	return &contender{name: name, run: func(n int) (time.Duration, error) {
		start := c.now
		for range n {
			d := per
			if c.now >= c.from && c.now < c.to {
				d *= 2
			}
			c.now += d
		}
		return c.now - start, nil
	}}
}

// A slow spell that covers one contender's window and not the other's
// skews the round's ratio by the whole slowdown; sliced, the two share it
// and the ratio stays near the truth (1).
func TestSlicesShareASlowSpell(t *testing.T) {
	for _, tc := range []struct {
		slices   int
		min, max float64
	}{{1, 1.9, 2.1}, {16, 0.9, 1.1}} {
		clock := &slowSpell{}
		cs := []*contender{clock.contender("a", time.Millisecond), clock.contender("b", time.Millisecond)}
		for _, c := range cs {
			c.n = 500 // calibrated already: no probes on the clock
			c.min = 500
		}
		// Calibration runs one probe of the minimum each (a second of the
		// clock); the spell lasts as long as the first window does in it.
		clock.from, clock.to = time.Second, 2*time.Second
		rates, err := interleave(cs, schedule{rounds: 1, slices: tc.slices, window: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if r := rates[1][0] / rates[0][0]; r < tc.min || r > tc.max {
			t.Errorf("%d slices: b/a %.2f, want in [%.1f, %.1f]", tc.slices, r, tc.min, tc.max)
		}
	}
}

// A guess from a smaller size starts the probes near the answer.
func TestCalibrateStartsFromAGuess(t *testing.T) {
	var order []string
	f := &fakeWork{name: "f", per: time.Microsecond, order: &order}
	c := f.contender()
	c.n = 500_000
	if err := calibrate(c, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 1 || f.calls[0] != 62_500 || c.n != 500_000 {
		t.Errorf("probes %v, n %d; want one probe of 62500, n 500000", f.calls, c.n)
	}
}

func TestInterleaveStopsAtAnError(t *testing.T) {
	fail := &contender{name: "failing", run: func(int) (time.Duration, error) { return 0, api.ErrInternal }}
	_, err := interleave([]*contender{fail}, schedule{rounds: 5, slices: 4, window: time.Millisecond})
	if !errors.Is(err, api.ErrInternal) || err.Error() != "failing: "+api.ErrInternal.Error() {
		t.Errorf("err %v", err)
	}
}
