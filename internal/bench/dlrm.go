package bench

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/models"
)

// A DLRM-style inference step (models.DLRM): a batch of bags of
// embedding-table rows is pooled (embedding_bag_sum), then goes through two
// dense layers (sgemm, sgemm), and the outputs come back to the host. Several tenants, each its
// own session, serve the same model at once, as replicas of an inference
// service do. The model is loaded and run twice: without residency hints,
// and with them (the weights hinted and sealed, so that a node holding
// them already is not sent them again; the per-step buffers hinted as
// staging and activations). Either way each tenant copies the weights in
// from shared host memory (client.HostAlloc). What counts is the bytes the mediator moved to
// and from nodes for the tenants' sessions (api.SessionStats NetOut+NetIn).

// DLRMShape sizes the model and the run (models.DLRMShape).
type DLRMShape = models.DLRMShape

// DLRMRun is one tenant count, with or without hints.
type DLRMRun struct {
	Tenants int  `json:"tenants"`
	Hints   bool `json:"hints"`
	// Bytes the mediator sent to and received from nodes for all the
	// tenants' sessions: while they loaded the model, and while they ran
	// their steps.
	LoadBytes  uint64  `json:"load_bytes"`
	StepBytes  uint64  `json:"step_bytes"`
	DedupBytes uint64  `json:"dedup_bytes"` // of the load, not sent because a node had them
	LoadS      float64 `json:"load_s"`
	Steps      int     `json:"steps"`       // all tenants, each checked
	StepsPerS  float64 `json:"steps_per_s"` // all tenants together
	// BytesRatio, in a run with hints, is the bytes (load and steps) of
	// the same tenant count without hints over the bytes with them.
	BytesRatio float64 `json:"bytes_ratio,omitempty"`
	// ReloadBytes is what one tenant moved to load the model again and run
	// a step, once every session of the run had ended: an inference
	// server restarting. ReloadRatio, in a run with hints, is that without
	// hints over that with them.
	ReloadBytes uint64  `json:"reload_bytes"`
	ReloadRatio float64 `json:"reload_ratio,omitempty"`
}

// Bytes is everything the run moved between mediator and nodes.
func (r DLRMRun) Bytes() uint64 { return r.LoadBytes + r.StepBytes }

// dlrmTenant is one tenant's session serving the model.
type dlrmTenant struct {
	c             *client.Client
	s             *client.Stream
	table, w1, w2 client.Ptr
	idx, off      client.Ptr
	emb, hid, out client.Ptr
	got           []byte
	steps         int // checked
}

// load allocates the model and the step buffers and copies the weights in
// (models.Upload); with hints, the weights are hinted and sealed, the rest
// hinted too.
func (t *dlrmTenant) load(m *models.DLRM, hints bool) error {
	ptrs, err := models.Upload(t.c, m.Weights(), hints)
	if err != nil {
		return err
	}
	t.table, t.w1, t.w2 = ptrs[0], ptrs[1], ptrs[2]
	bufs := []struct {
		p    *client.Ptr
		size int
		hint api.Hint
	}{
		{&t.idx, m.Batch * m.Pooling * 4, api.HintStaging}, {&t.off, m.Batch * 4, api.HintStaging},
		{&t.emb, m.Batch * m.Dim * 4, api.HintActivation}, {&t.hid, m.Batch * m.Hidden * 4, api.HintActivation},
		{&t.out, m.Batch * m.Out * 4, api.HintActivation},
	}
	for _, b := range bufs {
		var o client.AllocOptions
		if hints {
			o.Hint = b.hint
		}
		if *b.p, err = t.c.MallocWith(0, uint64(b.size), o); err != nil {
			return err
		}
	}
	t.got = make([]byte, m.Batch*m.Out*4)
	return nil
}

// step runs batch k of m and checks the outputs against the host's.
func (t *dlrmTenant) step(m *models.DLRM, k int) error {
	b := &m.Batches[k]
	s := t.s
	s.CopyToDevice(t.idx, client.Int32Bytes(b.Indices))
	s.CopyToDevice(t.off, client.Int32Bytes(b.Offsets))
	s.Launch("embedding_bag_sum", client.Buf(t.table), client.I64(int64(m.Rows)), client.I64(int64(m.Dim)),
		client.Buf(t.idx), client.I64(int64(m.Batch*m.Pooling)), client.Buf(t.off), client.I64(int64(m.Batch)), client.Buf(t.emb))
	s.Launch("sgemm", client.I64(int64(m.Batch)), client.I64(int64(m.Hidden)), client.I64(int64(m.Dim)), client.F32(1),
		client.Buf(t.emb), client.Buf(t.w1), client.F32(0), client.Buf(t.hid))
	s.Launch("sgemm", client.I64(int64(m.Batch)), client.I64(int64(m.Out)), client.I64(int64(m.Hidden)), client.F32(1),
		client.Buf(t.hid), client.Buf(t.w2), client.F32(0), client.Buf(t.out))
	clear(t.got)
	s.CopyFromDevice(t.got, t.out)
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := m.Check(k, t.got); err != nil {
		return fmt.Errorf("%w: %w", err, api.ErrInternal)
	}
	t.steps++
	return nil
}

// stats sums the network and dedup bytes of the tenants' sessions.
func stats(ts []*dlrmTenant) (net, dedup uint64, err error) {
	for i, t := range ts {
		st, err := t.c.Stats()
		if err != nil {
			return 0, 0, fmt.Errorf("tenant %d: stats: %w", i+1, err)
		}
		net += st.NetOut + st.NetIn
		dedup += st.DedupBytes
	}
	return net, dedup, nil
}

// eachTenant runs f for every tenant at once and joins their errors.
func eachTenant[T any](ts []T, f func(i int, t T) error) error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Go(func() {
			if err := f(i, t); err != nil {
				errs[i] = fmt.Errorf("tenant %d: %w", i+1, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runDLRM serves m with n tenants: the first loads the model (and with
// hints seals it), then the others load it at once, then all run their
// steps at once. Once they have all left, the first comes back (reload).
func runDLRM(socket string, m *models.DLRM, n int, hints bool) (DLRMRun, error) {
	r, err := serveDLRM(socket, m, n, hints)
	if err != nil {
		return r, err
	}
	r.ReloadBytes, err = reload(socket, m, hints)
	return r, err
}

// dialDLRM opens a session for tenant i (from 0) of a DLRM run.
func dialDLRM(socket string, i int) (*dlrmTenant, error) {
	c, err := client.Dial(client.Options{Socket: socket, Tenant: fmt.Sprintf("dlrm-%d", i+1)})
	if err != nil {
		return nil, err
	}
	return &dlrmTenant{c: c, s: c.Stream()}, nil
}

// sessions are the sessions of ts, those dialled.
func sessions(ts []*dlrmTenant) []*client.Client {
	var cs []*client.Client
	for _, t := range ts {
		if t != nil {
			cs = append(cs, t.c)
		}
	}
	return cs
}

// closeAll ends the sessions cs and waits until the mediator has torn
// them down, their device memory freed.
func closeAll(socket string, cs []*client.Client) error {
	var ids []uint64
	for _, c := range cs {
		ids = append(ids, c.Session())
		c.Close()
	}
	op, err := client.DialOperator(socket)
	if err != nil {
		return err
	}
	defer op.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := op.Status()
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(st.Tenants, func(t api.TenantStatus) bool { return slices.Contains(ids, t.Session) }) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sessions %v still open 10 s after they closed: %w", ids, api.ErrUnavailable)
		}
	}
}

// reload has the first tenant of a run that has ended load m again and run
// one step, checked, and returns the bytes it moved.
func reload(socket string, m *models.DLRM, hints bool) (uint64, error) {
	t, err := dialDLRM(socket, 0)
	if err != nil {
		return 0, err
	}
	defer closeAll(socket, []*client.Client{t.c})
	if err := t.load(m, hints); err != nil {
		return 0, fmt.Errorf("reloading the model: %w", err)
	}
	if err := t.step(m, 0); err != nil {
		return 0, fmt.Errorf("reloading the model: step: %w", err)
	}
	n, _, err := stats([]*dlrmTenant{t})
	return n, err
}

// serveDLRM is runDLRM up to the end of the steps and of the sessions.
func serveDLRM(socket string, m *models.DLRM, n int, hints bool) (r DLRMRun, err error) {
	r = DLRMRun{Tenants: n, Hints: hints}
	ts := make([]*dlrmTenant, n)
	defer func() { err = errors.Join(err, closeAll(socket, sessions(ts))) }()
	for i := range ts {
		if ts[i], err = dialDLRM(socket, i); err != nil {
			return r, err
		}
	}
	start := time.Now()
	if err := ts[0].load(m, hints); err != nil {
		return r, fmt.Errorf("tenant 1: loading the model: %w", err)
	}
	if err := eachTenant(ts[1:], func(_ int, t *dlrmTenant) error { return t.load(m, hints) }); err != nil {
		return r, fmt.Errorf("loading the model: %w", err)
	}
	r.LoadS = time.Since(start).Seconds()
	loaded, dedup, err := stats(ts)
	if err != nil {
		return r, err
	}
	r.LoadBytes, r.DedupBytes = loaded, dedup

	start = time.Now()
	if err := eachTenant(ts, func(i int, t *dlrmTenant) error {
		for j := range m.Steps {
			if err := t.step(m, (i+j)%len(m.Batches)); err != nil {
				return fmt.Errorf("step %d: %w", j, err)
			}
		}
		return nil
	}); err != nil {
		return r, err
	}
	elapsed := time.Since(start)
	total, _, err := stats(ts)
	if err != nil {
		return r, err
	}
	r.StepBytes = total - loaded
	for _, t := range ts {
		r.Steps += t.steps
	}
	r.StepsPerS = float64(r.Steps) / elapsed.Seconds()
	return r, nil
}

// dlrm runs every tenant count without hints, then with them, on a model
// of its own per tenant count (so that no run finds another's weights on
// a node).
func dlrm(socket string, sh DLRMShape, tenants []int, progress func(string)) ([]DLRMRun, error) {
	var out []DLRMRun
	for _, n := range tenants {
		m := models.NewDLRM(sh, uint64(n))
		var without DLRMRun
		for _, hints := range []bool{false, true} {
			progress(fmt.Sprintf("DLRM inference, %d tenants, hints %v", n, hints))
			r, err := runDLRM(socket, m, n, hints)
			if err != nil {
				return nil, fmt.Errorf("DLRM with %d tenants, hints %v: %w", n, hints, err)
			}
			if hints {
				r.BytesRatio = ratio(float64(without.Bytes()), float64(r.Bytes()))
				r.ReloadRatio = ratio(float64(without.ReloadBytes), float64(r.ReloadBytes))
			} else {
				without = r
			}
			out = append(out, r)
		}
	}
	return out, nil
}
