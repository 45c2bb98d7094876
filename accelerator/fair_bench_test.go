package accelerator

// Benchmarks of the compute scheduler through the node's real path: tenants
// are mediator connections over loopback TCP to an in-process sim node, each
// saying its weight in its Hello. Shares are taken while every tenant is
// backlogged, two ways: from the scheduler's own accounting
// (NodeStatus.Shares, the ledger), and from the work each tenant's client saw
// complete (launches of one size answered), which is what a tenant gets and
// what a ledger that agreed with itself could not fake.
// Each benchmark reports its figure and logs when it misses its target; as
// benchmarks they do not fail on a slow or loaded host.
//
//	go test -run xxx -bench 'Fairness|Weights|Noisy' -benchtime 1x ./accelerator/

import (
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

const (
	benchWarmup  = 300 * time.Millisecond
	benchMeasure = 2 * time.Second
	bigDim       = 256 // sgemm bigDim³: 16.8M multiply-adds, ~80 slices
	smallDim     = 32  // sgemm smallDim³: one slice
)

// benchTenant is one mediator connection acting for a tenant, with one frame
// holding the buffers of an sgemm.
type benchTenant struct {
	name string
	rpc  *wire.RPC
	big  *api.NodeLaunch
	smol *api.NodeLaunch
	done atomic.Int64 // launches flood saw complete
}

func dialTenant(b *testing.B, addr, name string, weight uint32, computeMax float32) *benchTenant {
	b.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	rpc := wire.NewRPC(wire.NewConn(nc), "node "+addr)
	b.Cleanup(func() { rpc.Close() })
	hello := &api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleMediator, Tenant: name, Weight: weight, ComputeMax: computeMax}
	if _, err := rpc.Call(api.OpHello, nil, api.Encode(hello)); err != nil {
		b.Fatalf("hello as %s: %v", name, err)
	}
	body, err := rpc.Call(api.OpNodeAlloc, nil, api.Encode(&api.NodeAlloc{Device: 0, Count: 1}))
	if err != nil {
		b.Fatal(err)
	}
	var fr api.NodeFrames
	if err := api.Decode(body, &fr); err != nil {
		b.Fatal(err)
	}
	return &benchTenant{name: name, rpc: rpc, big: sgemmLaunch(fr.Frames[0], bigDim), smol: sgemmLaunch(fr.Frames[0], smallDim)}
}

// sgemmLaunch is C = A·B + C on n×n matrices laid out from base.
func sgemmLaunch(base uint64, n uint64) *api.NodeLaunch {
	sz := 4 * n * n
	buf := func(i uint64) api.NodeArg {
		return api.NodeArg{Kind: api.ArgBuffer, Extents: []api.Extent{{Addr: base + i*sz, Len: sz}}}
	}
	i64 := func(v uint64) api.NodeArg { return api.NodeArg{Kind: api.ArgI64, Bits: v} }
	f32 := func(v float32) api.NodeArg { return api.NodeArg{Kind: api.ArgF32, Bits: uint64(math.Float32bits(v))} }
	return &api.NodeLaunch{Device: 0, Kernel: "sgemm", Args: []api.NodeArg{
		i64(n), i64(n), i64(n), f32(1), buf(0), buf(1), f32(1), buf(2)}}
}

// flood keeps depth launches of l in flight until stop.
func (t *benchTenant) flood(b *testing.B, l *api.NodeLaunch, depth int, stop <-chan struct{}) {
	body := api.Encode(l)
	var inflight []*wire.Call
	for {
		select {
		case <-stop:
			for _, c := range inflight {
				c.Wait()
			}
			return
		default:
		}
		for len(inflight) < depth {
			inflight = append(inflight, t.rpc.Go(api.OpNodeLaunch, nil, body))
		}
		if err := inflight[0].Wait(); err != nil {
			b.Errorf("%s: launch: %v", t.name, err)
			return
		}
		inflight = inflight[1:]
		t.done.Add(1)
	}
}

// deviceTime is each tenant's device time on device 0 so far.
func deviceTime(n *Node) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, s := range n.Status().Shares {
		if s.Device == 0 {
			m[s.Tenant] = s.DeviceTime
		}
	}
	return m
}

// measureShares starts one flooding tenant per weight and returns each one's
// share of the device time used while all of them were backlogged, by the
// ledger, and its share of the launches completed meanwhile, by its client.
func measureShares(b *testing.B, weights []uint32) (ledger, work []float64) {
	node, addr, err := StartSim("127.0.0.1:0", 1, 64<<20, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	tenants := make([]*benchTenant, len(weights))
	for i, w := range weights {
		tenants[i] = dialTenant(b, addr.String(), fmt.Sprintf("t%d-w%d", i, w), w, 0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, t := range tenants {
		wg.Go(func() { t.flood(b, t.big, 2, stop) })
	}
	time.Sleep(benchWarmup)
	before, doneBefore := deviceTime(node), completed(tenants)
	time.Sleep(benchMeasure)
	after, doneAfter := deviceTime(node), completed(tenants)
	close(stop)
	wg.Wait()
	ledger, work = make([]float64, len(tenants)), make([]float64, len(tenants))
	for i, t := range tenants {
		ledger[i] = (after[t.name] - before[t.name]).Seconds()
		work[i] = float64(doneAfter[i] - doneBefore[i])
	}
	b.ReportMetric(sum(ledger)/benchMeasure.Seconds(), "busy")
	return normalize(ledger), normalize(work)
}

// completed is the launches each tenant's flood has seen complete so far.
func completed(tenants []*benchTenant) []int64 {
	n := make([]int64, len(tenants))
	for i, t := range tenants {
		n[i] = t.done.Load()
	}
	return n
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// normalize divides xs by their sum, in place, and returns it.
func normalize(xs []float64) []float64 {
	s := sum(xs)
	for i := range xs {
		xs[i] /= s
	}
	return xs
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// has everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	return s * s / (float64(len(xs)) * s2)
}

// BenchmarkFairness: four tenants of equal weight saturate one device with
// long sgemms; Jain's index of their device time and of their completed
// launches (target ≥ 0.99).
func BenchmarkFairness(b *testing.B) {
	var shares, work []float64
	for b.Loop() {
		shares, work = measureShares(b, []uint32{1, 1, 1, 1})
	}
	j, jw := jain(shares), jain(work)
	b.ReportMetric(j, "jain")
	b.ReportMetric(slices.Min(shares), "min-share")
	b.ReportMetric(slices.Max(shares), "max-share")
	b.ReportMetric(jw, "work-jain")
	b.ReportMetric(slices.Min(work), "work-min-share")
	b.ReportMetric(slices.Max(work), "work-max-share")
	if j < 0.99 || jw < 0.99 {
		b.Logf("target missed: Jain's index %.4f of device time (shares %.4f), %.4f of work (shares %.4f); want ≥ 0.99", j, shares, jw, work)
	}
}

// BenchmarkWeights: tenants of weights 1:2:3:4 (each within ±5% of its
// share) and 10:90 (each within ±2 percentage points).
func BenchmarkWeights(b *testing.B) {
	for _, tc := range []struct {
		name    string
		weights []uint32
	}{{"1:2:3:4", []uint32{1, 2, 3, 4}}, {"10:90", []uint32{10, 90}}} {
		b.Run(tc.name, func(b *testing.B) {
			var ledger, work []float64
			for b.Loop() {
				ledger, work = measureShares(b, tc.weights)
			}
			var total float64
			for _, w := range tc.weights {
				total += float64(w)
			}
			for _, m := range []struct {
				prefix string // of the metrics' names
				shares []float64
			}{{"", ledger}, {"work-", work}} {
				var maxRel, maxPP float64
				for i, w := range tc.weights {
					want := float64(w) / total
					rel := 100 * math.Abs(m.shares[i]/want-1)
					pp := 100 * math.Abs(m.shares[i]-want)
					maxRel, maxPP = max(maxRel, rel), max(maxPP, pp)
					b.ReportMetric(100*m.shares[i], fmt.Sprintf("%%%sshare-w%d", m.prefix, w))
				}
				b.ReportMetric(maxRel, m.prefix+"max-rel-dev-%")
				b.ReportMetric(maxPP, m.prefix+"max-dev-pp")
				if len(tc.weights) == 4 && maxRel > 5 {
					b.Logf("target missed: weights %s: %sshares %.4f, a tenant is %.2f%% off its share", tc.name, m.prefix, m.shares, maxRel)
				}
				if len(tc.weights) == 2 && maxPP > 2 {
					b.Logf("target missed: weights %s: %sshares %.4f, %.2f points off", tc.name, m.prefix, m.shares, maxPP)
				}
			}
		})
	}
}

// victimLatencies launches small kernels one at a time for d and returns
// their latencies.
func victimLatencies(b *testing.B, t *benchTenant, d time.Duration) []time.Duration {
	body := api.Encode(t.smol)
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		if _, err := t.rpc.Call(api.OpNodeLaunch, nil, body); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return lat
}

func percentile(lat []time.Duration, p float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// noisyRounds is how many times the noisy-neighbour benchmark measures the
// victim alone and then beside the flood, so that a slow moment of the host
// weighs on both.
const noisyRounds = 4

// BenchmarkNoisyNeighbour: a victim's small sgemm (one slice) p99 latency
// beside a tenant flooding large sgemms, against its p99 alone (target ≤ 2×).
func BenchmarkNoisyNeighbour(b *testing.B) {
	var alone, noisy []time.Duration
	for b.Loop() {
		node, addr, err := StartSim("127.0.0.1:0", 1, 64<<20, quietLog())
		if err != nil {
			b.Fatal(err)
		}
		victim := dialTenant(b, addr.String(), "victim", 1, 0)
		bully := dialTenant(b, addr.String(), "bully", 1, 0)
		bully2 := dialTenant(b, addr.String(), "bully", 1, 0) // a second connection of the same tenant
		victimLatencies(b, victim, benchWarmup)
		window := benchMeasure / noisyRounds
		for range noisyRounds {
			alone = append(alone, victimLatencies(b, victim, window)...)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { bully.flood(b, bully.big, 4, stop) })
			wg.Go(func() { bully2.flood(b, bully2.big, 4, stop) })
			time.Sleep(benchWarmup / noisyRounds)
			noisy = append(noisy, victimLatencies(b, victim, window)...)
			close(stop)
			wg.Wait()
		}
		used := deviceTime(node)
		node.Close()
		b.ReportMetric(used["victim"].Seconds()/(used["victim"]+used["bully"]).Seconds(), "victim-share")
	}
	pa, pn := percentile(alone, 0.99), percentile(noisy, 0.99)
	ratio := pn.Seconds() / pa.Seconds()
	b.ReportMetric(float64(percentile(alone, 0.5).Microseconds()), "p50-alone-µs")
	b.ReportMetric(float64(percentile(alone, 0.9).Microseconds()), "p90-alone-µs")
	b.ReportMetric(float64(pa.Microseconds()), "p99-alone-µs")
	b.ReportMetric(float64(percentile(alone, 0.999).Microseconds()), "p99.9-alone-µs")
	b.ReportMetric(float64(percentile(noisy, 0.5).Microseconds()), "p50-noisy-µs")
	b.ReportMetric(float64(percentile(noisy, 0.9).Microseconds()), "p90-noisy-µs")
	b.ReportMetric(float64(pn.Microseconds()), "p99-noisy-µs")
	b.ReportMetric(float64(percentile(noisy, 0.999).Microseconds()), "p99.9-noisy-µs")
	b.ReportMetric(ratio, "p99-ratio")
	if ratio > 2 {
		b.Logf("target missed: victim p99 %v beside a flood, %v alone: %.2f×", pn, pa, ratio)
	}
}
