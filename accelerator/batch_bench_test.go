package accelerator

// BenchmarkBatchLaunch measures the node's cost of tiny launches (fill_f32
// of one float): in batches of batchLaunches over one connection to an
// in-process node, against the baseline of the same launches sent one per
// request, pipelined, in the same run.
//
//	go test -run xxx -bench BatchLaunch ./accelerator/

import (
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

const batchLaunches = 1024

func BenchmarkBatchLaunch(b *testing.B) {
	tn := startNode(b)
	c := tn.connect(b, "bench")
	f := c.alloc(0, 1)[0]
	launch := func(i int) *api.NodeLaunch {
		return &api.NodeLaunch{Kernel: "fill_f32", Args: []api.NodeArg{bufArg(ext(f, 4*uint64(i), 4)), i64Arg(1), f32Arg(float32(i))}}
	}
	check := func(b *testing.B) {
		got := bytesF32(c.mustRead(0, ext(f, 0, 4*batchLaunches)))
		for i, v := range got {
			if v != float32(i) {
				b.Fatalf("float %d is %v after the launches", i, v)
			}
		}
	}
	b.Run("batch", func(b *testing.B) {
		batch := &api.Batch{Cmds: make([]api.Cmd, batchLaunches)}
		for i := range batch.Cmds {
			batch.Cmds[i] = api.Cmd{Op: api.OpNodeLaunch, Body: api.Encode(launch(i))}
		}
		body := api.Encode(batch)
		for b.Loop() {
			if _, err := c.rpc.Call(api.OpNodeBatch, nil, body); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batchLaunches)/b.Elapsed().Seconds(), "launches/s")
		check(b)
	})
	b.Run("unbatched", func(b *testing.B) {
		bodies := make([][]byte, batchLaunches)
		for i := range bodies {
			bodies[i] = api.Encode(launch(i))
		}
		calls := make([]*wire.Call, batchLaunches)
		for b.Loop() {
			for i, body := range bodies {
				calls[i] = c.rpc.Go(api.OpNodeLaunch, nil, body)
			}
			for _, call := range calls {
				if err := call.Wait(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*batchLaunches)/b.Elapsed().Seconds(), "launches/s")
		check(b)
	})
}
