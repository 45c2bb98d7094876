package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/internal/models"
)

// The GPT-style decoder of internal/models, measured three ways in one run
// (docs/graphs.md):
//
//   - Graph against op by op. Two sessions decode the same model along the
//     reference's greedy path (each step fed the reference's token, and its
//     own choice checked against the reference's): one invokes registered
//     prefill and decode graphs, whose weights were hinted and sealed; the
//     other launches the same kernels one by one on a stream, weights
//     uploaded once without hints, as driver-level remoting does. Rounds
//     alternate the two. Per decode step: the time (median), the requests
//     on the tenant's socket (client.Client.Requests), and the bytes on the
//     tenant's socket and on the mediator's node links (api.SessionStats).
//   - A decode beside a flood of prefills. One session decodes at a steady
//     pace (a third of the device), in windows alone and windows in which
//     another session on the same device runs prefills of the whole context
//     back to back; its step time's p99 beside the flood over its p99
//     alone. Then the same with the graphs registered with api.PhaseOther,
//     which withholds the phases from the node's scheduler.
//   - Eight tenants loading the same model, without hints and with them:
//     the bytes sent to the node, in copies of the weights. A node
//     deduplicates sealed weights by whole 2 MiB frames; with hints each
//     tenant uploads the model as one sealed allocation of whole frames
//     (models.Upload), so every tenant but the first sends hashes only.
//     The model is the decoder's configuration with weights of its own
//     (loadSeed), so that it finds none of the other parts' on the node.

// loadSeed changes the decoder's seed for the load part.
const loadSeed = 0x10ad

// DecoderOptions size the decoder part of a run; zero values take the
// defaults.
type DecoderOptions struct {
	Model  models.GPTConfig // default models.SmallGPT
	Prompt int              // prompt tokens, prefilled before the timed decode steps; default 16
	// Steps is the decode steps timed per way in each round, at most
	// Model.Context − Prompt; default 64; negative: no decoder part.
	Steps  int
	Rounds int // default 5
	// FloodSteps is the decode steps timed alone, and again beside the
	// flood, in four windows each; default 400.
	FloodSteps  int
	LoadTenants int // tenants loading Model (weights of their own: loadSeed); default 8
}

func (o *DecoderOptions) defaults() {
	if o.Model == (models.GPTConfig{}) {
		o.Model = models.SmallGPT
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Prompt, 16)
	def(&o.Steps, 64)
	def(&o.Rounds, 5)
	def(&o.FloodSteps, 400)
	def(&o.LoadTenants, 8)
}

func (o *DecoderOptions) check() error {
	if err := o.Model.Check(); err != nil {
		return err
	}
	switch {
	case o.Prompt < 1 || o.Prompt >= o.Model.Context:
		return fmt.Errorf("decoder prompt of %d tokens: want 1 to the context less one, %d: %w", o.Prompt, o.Model.Context-1, api.ErrInvalidArgument)
	case o.Steps < 2 || o.Steps > o.Model.Context-o.Prompt:
		return fmt.Errorf("%d decode steps after a prompt of %d: want 2 to what the context of %d leaves: %w", o.Steps, o.Prompt, o.Model.Context, api.ErrInvalidArgument)
	case o.Rounds < 1 || o.FloodSteps < floodWindows || o.LoadTenants < 1:
		return fmt.Errorf("decoder rounds %d, flood steps %d, load tenants %d: want at least 1, %d and 1: %w",
			o.Rounds, o.FloodSteps, o.LoadTenants, floodWindows, api.ErrInvalidArgument)
	}
	return nil
}

// DecoderReport is the decoder part of a run. Its fields are flat in the
// report's JSON.
type DecoderReport struct {
	Model  models.GPTConfig `json:"decoder_model"`
	Prompt int              `json:"decoder_prompt"`
	Rounds int              `json:"decoder_rounds"`
	Steps  int              `json:"decoder_steps"` // decode steps timed per way, all rounds

	// Per decode step, medians over every step of every round.
	GraphStepUs float64 `json:"decode_step_graph_us"`
	OpsStepUs   float64 `json:"decode_step_ops_us"`
	StepRatio   float64 `json:"decode_step_graph_vs_ops_ratio"`
	// StepRatios is the same ratio in each round: its spread, whose ends
	// are StepRatioMin and StepRatioMax.
	StepRatios   []float64 `json:"decode_step_graph_vs_ops_by_round"`
	StepRatioMin float64   `json:"decode_step_graph_vs_ops_ratio_min"`
	StepRatioMax float64   `json:"decode_step_graph_vs_ops_ratio_max"`

	// Requests on the tenant's socket per decode step.
	RoundTrips    float64 `json:"decode_round_trips_per_step"`
	OpsRoundTrips float64 `json:"decode_ops_round_trips_per_step"`
	// Bytes per decode step on the tenant's socket (both ways) and on the
	// mediator's node links (both ways).
	GraphTenantBytes  float64 `json:"decode_graph_tenant_bytes_per_step"`
	GraphNodeBytes    float64 `json:"decode_graph_node_bytes_per_step"`
	OpsTenantBytes    float64 `json:"decode_ops_tenant_bytes_per_step"`
	OpsNodeBytes      float64 `json:"decode_ops_node_bytes_per_step"`
	CommandBytesRatio float64 `json:"decode_command_bytes_graph_vs_ops_ratio"`

	// KV cache: what one token appends to the caches of every layer, the
	// graph's node-link bytes per step in the first and the second half of
	// each round's steps (later steps attend to longer caches), and from
	// those the cache bytes that can have crossed the network per step: 0
	// when no step moved even one token's entries and later steps moved no
	// more than earlier ones; otherwise, as a bound, all of the node-link
	// bytes of a step.
	KVBytesPerToken    uint64  `json:"kv_cache_bytes_per_token"`
	NodeBytesEarly     float64 `json:"decode_graph_node_bytes_per_step_early"`
	NodeBytesLate      float64 `json:"decode_graph_node_bytes_per_step_late"`
	KVBytesOverNetwork float64 `json:"kv_cache_bytes_over_network_per_step"`

	Flood []FloodRun `json:"decoder_flood"` // with phases, then without
	// The p99 ratios of Flood, with phases and without.
	FloodRatio         float64 `json:"decode_p99_under_prefill_flood_ratio"`
	FloodNoPhasesRatio float64 `json:"decode_p99_under_prefill_flood_no_phases_ratio"`

	Load []DecoderLoad `json:"decoder_load"` // without hints, then with
	// Bytes sent to nodes while LoadTenants tenants loaded the model with
	// hints, over the bytes of one copy of its weights (1: sent once);
	// the same without hints (LoadTenants: sent by each); and without
	// hints over with them.
	LoadSentRatio        float64 `json:"decoder_load_sent_over_weight_bytes_ratio"`
	LoadSentNoHintsRatio float64 `json:"decoder_load_sent_over_weight_bytes_no_hints_ratio"`
	LoadHintRatio        float64 `json:"decoder_load_bytes_without_over_with_hints_ratio"`
}

// FloodRun is a decode beside a flood of prefills, with or without phases.
type FloodRun struct {
	Phases bool   `json:"phases"`
	Device string `json:"device"` // both sessions': its name, of its node
	Steps  int    `json:"steps"`  // timed, each alone and beside the flood
	// PeriodUs is the victim's pace: a step begins every PeriodUs (three
	// times its median step alone, measured first), or as soon as the one
	// before ends if that is later.
	PeriodUs      float64 `json:"period_us"`
	AloneP50Us    float64 `json:"alone_p50_us"`
	AloneP99Us    float64 `json:"alone_p99_us"`
	FloodP50Us    float64 `json:"flood_p50_us"`
	FloodP99Us    float64 `json:"flood_p99_us"`
	Ratio         float64 `json:"p99_ratio"`
	FloodPrefills int     `json:"flood_prefills"` // prefills of the context the flooding tenant completed
}

// DecoderLoad is LoadTenants tenants loading the model, with or without
// hints.
type DecoderLoad struct {
	Model       models.GPTConfig `json:"model"`
	Tenants     int              `json:"tenants"`
	Hints       bool             `json:"hints"`
	WeightBytes uint64           `json:"weight_bytes"` // one copy
	SentBytes   uint64           `json:"sent_bytes"`   // to nodes, all tenants, while loading
	DedupBytes  uint64           `json:"dedup_bytes"`  // not sent because a node had them
}

// decoder runs the decoder part.
func decoder(socket string, o DecoderOptions, progress func(string)) (*DecoderReport, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	m, err := models.NewGPT(o.Model)
	if err != nil {
		return nil, err
	}
	sc, err := newScript(m, o.Prompt)
	if err != nil {
		return nil, err
	}
	r := &DecoderReport{Model: o.Model, Prompt: o.Prompt, Rounds: o.Rounds, Steps: o.Steps * o.Rounds,
		KVBytesPerToken: uint64(2 * 4 * o.Model.Layers * o.Model.DModel)}
	progress("decoder: registered graphs against op-by-op launches")
	if err := graphAgainstOps(socket, m, sc, o, r); err != nil {
		return nil, fmt.Errorf("decoder, graph against op by op: %w", err)
	}
	for _, phases := range []bool{true, false} {
		progress(fmt.Sprintf("decoder: decode beside a prefill flood, phases %v", phases))
		f, err := flood(socket, m, sc, o.FloodSteps, phases)
		if err != nil {
			return nil, fmt.Errorf("decoder beside a prefill flood, phases %v: %w", phases, err)
		}
		r.Flood = append(r.Flood, f)
	}
	r.FloodRatio, r.FloodNoPhasesRatio = r.Flood[0].Ratio, r.Flood[1].Ratio

	lc := o.Model
	lc.Seed ^= loadSeed
	lm, err := models.NewGPT(lc)
	if err != nil {
		return nil, err
	}
	for _, hints := range []bool{false, true} {
		progress(fmt.Sprintf("decoder: %d tenants load a model, hints %v", o.LoadTenants, hints))
		l, err := loadMany(socket, lm, o.LoadTenants, hints)
		if err != nil {
			return nil, fmt.Errorf("decoder, %d tenants loading, hints %v: %w", o.LoadTenants, hints, err)
		}
		r.Load = append(r.Load, l)
	}
	r.LoadSentRatio = ratio(float64(r.Load[1].SentBytes), float64(r.Load[1].WeightBytes))
	r.LoadSentNoHintsRatio = ratio(float64(r.Load[0].SentBytes), float64(r.Load[0].WeightBytes))
	r.LoadHintRatio = ratio(float64(r.Load[0].SentBytes), float64(r.Load[1].SentBytes))
	return r, nil
}

// script is the reference's greedy path from a prompt to the end of the
// context: tokens[0] follows the prompt, tokens[i+1] follows tokens[i],
// each chosen from logits[i].
type script struct {
	prompt []int32
	tokens []int32
	logits [][]float64
}

func newScript(m *models.GPT, promptLen int) (*script, error) {
	rng := rand.New(rand.NewPCG(m.Config.Seed, 0x736372))
	sc := &script{prompt: make([]int32, promptLen)}
	for i := range sc.prompt {
		sc.prompt[i] = int32(rng.IntN(m.Config.Vocab))
	}
	ref := m.Reference()
	in := sc.prompt
	for ref.Pos()+len(in) <= m.Config.Context {
		logits, err := ref.Forward(in)
		if err != nil {
			return nil, err
		}
		next := int32(models.Argmax(logits))
		sc.tokens, sc.logits = append(sc.tokens, next), append(sc.logits, logits)
		in = []int32{next}
	}
	return sc, nil
}

// decodeSession is a session decoding along a script, the reference's
// token fed at each step and its own choice checked.
type decodeSession struct {
	c   *client.Client
	run *models.GPTRunner
	sc  *script
	i   int // the next step feeds tokens[i]; −1 before the prefill
}

// newDecodeSession loads m into a new session of tenant (with hints for
// registered graphs; without for op by op) and registers or allocates its
// prefill and decode passes.
func newDecodeSession(opt client.Options, m *models.GPT, sc *script, o models.RunOptions) (*decodeSession, error) {
	c, err := client.Dial(opt)
	if err != nil {
		return nil, err
	}
	d := &decodeSession{c: c, sc: sc, i: -1}
	dev, err := m.Load(c, !o.OpByOp)
	if err == nil {
		o.Out = models.OutNext
		d.run = dev.Runner(o)
		err = d.run.Prepare(len(sc.prompt), 1)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", opt.Tenant, err)
	}
	return d, nil
}

// check checks the token a pass chose against the script's logits k.
func (d *decodeSession) check(st models.Step, k int) error {
	if _, _, err := models.CheckStep(st, d.sc.logits[k], models.OutNext, models.DemoTolerance); err != nil {
		return fmt.Errorf("step %d: %w: %w", k, err, api.ErrInternal)
	}
	return nil
}

// prefill runs the prompt at position 0 and checks the token it chose.
func (d *decodeSession) prefill() error {
	st, err := d.run.Forward(0, d.sc.prompt)
	if err == nil {
		err = d.check(st, 0)
	}
	d.i = 0
	return err
}

// step times one decode step, prefilling again first (untimed) at the end
// of the context.
func (d *decodeSession) step() (time.Duration, error) {
	if d.i < 0 || d.i+1 >= len(d.sc.tokens) {
		if err := d.prefill(); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	st, err := d.run.Forward(len(d.sc.prompt)+d.i, d.sc.tokens[d.i:d.i+1])
	took := time.Since(start)
	if err == nil {
		err = d.check(st, d.i+1)
	}
	d.i++
	return took, err
}

// counters are what a span of steps cost a session.
type counters struct {
	requests               uint64
	tenantBytes, nodeBytes uint64
}

func (d *decodeSession) counters() (counters, error) {
	st, err := d.c.Stats()
	return counters{d.c.Requests(), st.SocketIn + st.SocketOut, st.NetIn + st.NetOut}, err
}

func (c counters) sub(b counters) counters {
	return counters{c.requests - b.requests, c.tenantBytes - b.tenantBytes, c.nodeBytes - b.nodeBytes}
}

// wayRound is one way's round: its steps' times and costs.
type wayRound struct {
	times      []time.Duration
	early, all counters
}

// round prefills, then times n decode steps, counting what the first half
// and all of them cost. A Stats call costs a request and its bytes too,
// which the counts leave out: each is taken right after the previous.
func (d *decodeSession) round(n int) (w wayRound, err error) {
	if err := d.prefill(); err != nil {
		return w, err
	}
	var marks [3]counters
	var overhead counters // of one Stats call, measured now
	a, err := d.counters()
	if err == nil {
		marks[0], err = d.counters()
		overhead = marks[0].sub(a)
	}
	for k := 0; err == nil && k < n; k++ {
		var t time.Duration
		if t, err = d.step(); err == nil {
			w.times = append(w.times, t)
		}
		if err == nil && k+1 == n/2 {
			marks[1], err = d.counters()
		}
	}
	if err == nil {
		marks[2], err = d.counters()
	}
	if err != nil {
		return w, err
	}
	w.early = marks[1].sub(marks[0]).sub(overhead)
	w.all = marks[2].sub(marks[0]).sub(overhead).sub(overhead)
	return w, nil
}

// graphAgainstOps runs the rounds of the two ways, alternating which goes
// first, and fills in r's step, request, byte and KV figures.
func graphAgainstOps(socket string, m *models.GPT, sc *script, o DecoderOptions, r *DecoderReport) (err error) {
	graph, err := newDecodeSession(client.Options{Socket: socket, Tenant: "decode-graph"}, m, sc, models.RunOptions{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeAll(socket, []*client.Client{graph.c})) }()
	ops, err := newDecodeSession(client.Options{Socket: socket, Tenant: "decode-ops"}, m, sc, models.RunOptions{OpByOp: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeAll(socket, []*client.Client{ops.c})) }()

	var gTimes, oTimes []time.Duration
	var gAll, gEarly, oAll counters
	for k := range o.Rounds {
		ways := []*decodeSession{graph, ops}
		if k%2 == 1 {
			slices.Reverse(ways)
		}
		res := map[*decodeSession]wayRound{}
		for _, d := range ways {
			if res[d], err = d.round(o.Steps); err != nil {
				return err
			}
		}
		g, op := res[graph], res[ops]
		gTimes, oTimes = append(gTimes, g.times...), append(oTimes, op.times...)
		r.StepRatios = append(r.StepRatios, ratio(us(medianOf(g.times), 1), us(medianOf(op.times), 1)))
		gAll, gEarly, oAll = add(gAll, g.all), add(gEarly, g.early), add(oAll, op.all)
	}
	r.GraphStepUs, r.OpsStepUs = us(medianOf(gTimes), 1), us(medianOf(oTimes), 1)
	r.StepRatio = ratio(r.GraphStepUs, r.OpsStepUs)
	sp := spreadOf(r.StepRatios)
	r.StepRatioMin, r.StepRatioMax = sp.Min, sp.Max
	n := float64(r.Steps)
	per := func(v uint64) float64 { return float64(v) / n }
	r.RoundTrips, r.OpsRoundTrips = per(gAll.requests), per(oAll.requests)
	r.GraphTenantBytes, r.GraphNodeBytes = per(gAll.tenantBytes), per(gAll.nodeBytes)
	r.OpsTenantBytes, r.OpsNodeBytes = per(oAll.tenantBytes), per(oAll.nodeBytes)
	r.CommandBytesRatio = ratio(r.GraphTenantBytes+r.GraphNodeBytes, r.OpsTenantBytes+r.OpsNodeBytes)
	early := o.Steps / 2
	r.NodeBytesEarly = float64(gEarly.nodeBytes) / float64(early*o.Rounds)
	r.NodeBytesLate = float64(gAll.nodeBytes-gEarly.nodeBytes) / float64((o.Steps-early)*o.Rounds)
	if r.GraphNodeBytes >= float64(r.KVBytesPerToken) || r.NodeBytesLate > r.NodeBytesEarly {
		r.KVBytesOverNetwork = r.GraphNodeBytes
	}
	return nil
}

func add(a, b counters) counters {
	return counters{a.requests + b.requests, a.tenantBytes + b.tenantBytes, a.nodeBytes + b.nodeBytes}
}

// Beside the flood: how many windows alone and beside it alternate, the
// steps that measure the victim's pace first, and the share of the device
// its pace asks for.
const (
	floodWindows = 4
	floodWarmup  = 32
	floodDuty    = 1.0 / 3
)

// flood times a session's decode steps alone and beside another session's
// prefills of the whole context on the same device, in alternating
// windows, both sessions' graphs of their phases or of api.PhaseOther.
func flood(socket string, m *models.GPT, sc *script, steps int, phases bool) (f FloodRun, err error) {
	// The phases order the work of one device's scheduler, so both
	// sessions run on one device: each takes every device of the system
	// and uses its first. The mediator gives a session the devices with
	// the fewest sessions first, in their order on a tie; the first
	// session adds one to each, so the second gets the same order.
	// (Sessions on two devices of a sim node share only the host's CPU
	// cores, which no phase orders.)
	devices, err := systemDevices(socket)
	if err != nil {
		return f, err
	}
	o := models.RunOptions{NoPhases: !phases}
	victim, err := newDecodeSession(client.Options{Socket: socket, Tenant: "decode-victim", Devices: devices}, m, sc, o)
	if err != nil {
		return f, err
	}
	defer func() { err = errors.Join(err, closeAll(socket, []*client.Client{victim.c})) }()
	c, err := client.Dial(client.Options{Socket: socket, Tenant: "prefill-flood", Devices: devices})
	if err != nil {
		return f, err
	}
	defer func() { err = errors.Join(err, closeAll(socket, []*client.Client{c})) }()
	v, p := victim.c.Devices()[0], c.Devices()[0]
	if v.Node != p.Node || v.Name != p.Name {
		return f, fmt.Errorf("the decoding session got device %s of %s, the flooding one %s of %s, not the same: %w",
			v.Name, v.Node, p.Name, p.Node, api.ErrUnavailable)
	}
	dev, err := m.Load(c, true)
	if err != nil {
		return f, err
	}
	o.Out = models.OutNext
	flooder := dev.Runner(o)
	long := make([]int32, m.Config.Context)
	for i := range long {
		long[i] = sc.tokens[i%len(sc.tokens)]
	}
	if err := flooder.Prepare(len(long)); err != nil {
		return f, err
	}

	// The victim decodes at a steady pace, as a server streaming tokens to
	// a user does, using floodDuty of the device alone: within its fair
	// share of half the device beside the flood. (Back to back, it would
	// ask for the whole device, and beside another busy tenant its share,
	// not its phase, would set its step time.)
	warm := make([]time.Duration, 0, floodWarmup)
	for range floodWarmup {
		t, err := victim.step()
		if err != nil {
			return f, fmt.Errorf("warm-up: %w", err)
		}
		warm = append(warm, t)
	}
	period := time.Duration(float64(medianOf(warm)) / floodDuty)
	f = FloodRun{Phases: phases, Device: v.Name + " of " + v.Node, Steps: steps, PeriodUs: us(period, 1)}
	var alone, beside []time.Duration
	window := func(into *[]time.Duration, n int) error {
		next := time.Now()
		for range n {
			time.Sleep(time.Until(next))
			// A late step does not make the next ones hurry.
			if next = next.Add(period); next.Before(time.Now()) {
				next = time.Now()
			}
			t, err := victim.step()
			if err != nil {
				return err
			}
			*into = append(*into, t)
		}
		return nil
	}
	for w := range floodWindows {
		n := steps*(w+1)/floodWindows - steps*w/floodWindows
		if err := window(&alone, n); err != nil {
			return f, fmt.Errorf("alone: %w", err)
		}
		var stop atomic.Bool
		var floodErr error
		var wg sync.WaitGroup
		started := make(chan struct{})
		wg.Go(func() {
			close(started)
			for !stop.Load() {
				if _, floodErr = flooder.Forward(0, long); floodErr != nil {
					return
				}
				f.FloodPrefills++
			}
		})
		<-started
		err := window(&beside, n)
		stop.Store(true)
		wg.Wait()
		if err = errors.Join(err, floodErr); err != nil {
			return f, fmt.Errorf("beside the flood: %w", err)
		}
	}
	f.AloneP50Us, f.AloneP99Us = us(percentile(alone, 0.5), 1), us(percentile(alone, 0.99), 1)
	f.FloodP50Us, f.FloodP99Us = us(percentile(beside, 0.5), 1), us(percentile(beside, 0.99), 1)
	f.Ratio = ratio(f.FloodP99Us, f.AloneP99Us)
	return f, nil
}

// operatorStatus is the status of the mediator at socket.
func operatorStatus(socket string) (*api.Status, error) {
	op, err := client.DialOperator(socket)
	if err != nil {
		return nil, err
	}
	defer op.Close()
	return op.Status()
}

// systemDevices is how many devices the mediator at socket drives.
func systemDevices(socket string) (int, error) {
	st, err := operatorStatus(socket)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, nd := range st.Nodes {
		n += len(nd.Devices)
	}
	return n, nil
}

// percentile is the nearest-rank p-quantile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// loadMany has n tenants load m, the first alone and then the others at
// once, as replicas of an inference service start, and counts the bytes
// sent to nodes meanwhile. Each then runs one checked pass of one token, so
// that what was sent is known to hold the model.
func loadMany(socket string, m *models.GPT, n int, hints bool) (l DecoderLoad, err error) {
	l = DecoderLoad{Model: m.Config, Tenants: n, Hints: hints}
	for _, w := range m.Weights() {
		l.WeightBytes += uint64(4 * len(w.Data))
	}
	cs := make([]*client.Client, n)
	defer func() {
		err = errors.Join(err, closeAll(socket, slices.DeleteFunc(cs, func(c *client.Client) bool { return c == nil })))
	}()
	for i := range cs {
		if cs[i], err = client.Dial(client.Options{Socket: socket, Tenant: fmt.Sprintf("decoder-load-%d", i+1)}); err != nil {
			return l, err
		}
	}
	devs := make([]*models.GPTOnDevice, n)
	load := func(i int, c *client.Client) (err error) {
		devs[i], err = m.Load(c, hints)
		return err
	}
	if err := load(0, cs[0]); err != nil {
		return l, fmt.Errorf("tenant 1: %w", err)
	}
	if err := eachTenant(cs[1:], func(i int, c *client.Client) error { return load(i+1, c) }); err != nil {
		return l, err
	}
	for i, c := range cs {
		st, err := c.Stats()
		if err != nil {
			return l, fmt.Errorf("tenant %d: %w", i+1, err)
		}
		l.SentBytes += st.NetOut
		l.DedupBytes += st.DedupBytes
	}
	want, err := m.Reference().Forward([]int32{1})
	if err != nil {
		return l, err
	}
	err = eachTenant(devs, func(_ int, d *models.GPTOnDevice) error {
		run := d.Runner(models.RunOptions{OpByOp: !hints, Out: models.OutLogits})
		defer run.Close()
		st, err := run.Forward(0, []int32{1})
		if err == nil {
			_, _, err = models.CheckStep(st, want, models.OutLogits, models.DemoTolerance)
		}
		return err
	})
	return l, err
}
