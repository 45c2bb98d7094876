package mediator_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/vgpu/vgpu/client"
)

// BenchmarkWeightSwap: one tenant serves two models in turn from a device
// share that holds one at a time (its resident memory), as a server that
// swaps models does: each step sums one model's weights (reduce_sum_f32,
// checked), which faults it in and evicts the other. The models are
// sealed weights, so each eviction returns frames the node had sealed.
// The same steps run against a node that retains them, which the space
// then asks for those bytes by hash, and against one that scrubs them,
// alternately, in the same run; it reports the bytes sent to the node per
// step with each, and their ratio.
//
//	go test -run xxx -bench WeightSwap -benchtime 1x ./mediator/
func BenchmarkWeightSwap(b *testing.B) {
	const (
		model  = 16 << 20
		steps  = 16
		rounds = 3
	)
	type server struct {
		c      *client.Client
		models [2]client.Ptr
		sums   [2]float32
		out    client.Ptr
	}
	start := func(retain bool) *server {
		// Room for one model and the chunk of the output.
		sys := startOversubscribed(b, 256<<20, model+frame, 4, 64<<20)
		sys.nodes[0].SetRetention(retain)
		s := &server{c: sys.dial(b, "swapper", 1)}
		for i := range s.models {
			weights := randomBytes(uint64(20+i), model)
			for j := 0; j < model; j += 4 { // small floats: a sum with no infinities
				binary.LittleEndian.PutUint32(weights[j:], math.Float32bits(float32(weights[j]%7)/8))
			}
			var sum float64
			for j := 0; j < model; j += 4 {
				sum += float64(math.Float32frombits(binary.LittleEndian.Uint32(weights[j:])))
			}
			s.sums[i] = float32(sum)
			w, _ := upload(b, s.c, weights)
			if err := s.c.Seal(w); err != nil {
				b.Fatal(err)
			}
			s.models[i] = w
		}
		out, err := s.c.Malloc(0, 4)
		if err != nil {
			b.Fatal(err)
		}
		s.out = out
		return s
	}
	// run takes steps, checking each, and returns the bytes sent to the
	// node and the time they took.
	run := func(s *server) (uint64, time.Duration) {
		before, err := s.c.Stats()
		if err != nil {
			b.Fatal(err)
		}
		st := s.c.Stream()
		got := make([]byte, 4)
		t0 := time.Now()
		for k := range steps {
			i := k % 2
			st.Launch("reduce_sum_f32", client.I64(model/4), client.Buf(s.models[i]), client.Buf(s.out))
			st.CopyFromDevice(got, s.out)
			if err := st.Synchronize(); err != nil {
				b.Fatal(err)
			}
			if sum := math.Float32frombits(binary.LittleEndian.Uint32(got)); sum != s.sums[i] {
				b.Fatalf("step %d: model %d sums to %v, want %v", k, i, sum, s.sums[i])
			}
		}
		took := time.Since(t0)
		after, err := s.c.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return after.NetOut - before.NetOut, took
	}
	var with, without uint64
	var withT, withoutT time.Duration
	for b.Loop() {
		retained, scrubbed := start(true), start(false)
		run(retained) // both models sealed on the node and swapped once
		run(scrubbed)
		for range rounds {
			sent, took := run(retained)
			with, withT = with+sent, withT+took
			sent, took = run(scrubbed)
			without, withoutT = without+sent, withoutT+took
		}
	}
	n := float64(b.N * rounds * steps)
	b.ReportMetric(float64(with)/n, "B-sent/step-retained")
	b.ReportMetric(float64(without)/n, "B-sent/step-scrubbed")
	b.ReportMetric(float64(without)/math.Max(1, float64(with)), "sent-ratio")
	b.ReportMetric(withT.Seconds()*1e3/n, "ms/step-retained")
	b.ReportMetric(withoutT.Seconds()*1e3/n, "ms/step-scrubbed")
	if with*2 > without {
		b.Logf("target missed: a node that retains sealed weights saved less than half the bytes of a swap (%d against %d)", with, without)
	}
}
