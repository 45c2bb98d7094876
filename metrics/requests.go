package metrics

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// opSlots bounds the operations that get a latency histogram of their own;
// api's operations are numbered below it. Any other number a peer sends is
// counted as "unknown", so a peer cannot make series by inventing
// operations.
const opSlots = 128

// codeSlots bounds the error codes named in labels, likewise.
const codeSlots = 16

// latencyBuckets span a small operation on loopback (about 10 µs) to a
// multi-second copy or a node timing out.
var latencyBuckets = prometheus.ExponentialBuckets(10e-6, 4, 10)

// Requests is a wire.ReplyObserver that keeps a latency histogram of the
// requests a daemon answers, by operation, and counts its error replies by
// operation and code; for a mediator (NewRequests(true)), also the
// containers it admitted and refused. It is a prometheus.Collector of
// them. Its methods are safe for concurrent use.
type Requests struct {
	// byOp holds each operation's histogram once it has been answered,
	// looked up by number so that a reply costs no label hashing; slot
	// opSlots-1 serves every operation numbered past it. Only operations
	// seen get series, so a node does not list the mediator's and back.
	byOp     [opSlots]atomic.Pointer[prometheus.Observer]
	latency  *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	admitted prometheus.Counter     // nil unless admissions are counted
	refused  *prometheus.CounterVec // by code; nil unless admissions are counted
}

// NewRequests returns a Requests; admissions says whether to count
// container admissions (api.OpRegister), which only a mediator answers.
func NewRequests(admissions bool) *Requests {
	r := &Requests{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vgpu_request_duration_seconds",
			Help:    "Time from reading a request to writing its reply, by operation.",
			Buckets: latencyBuckets,
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_request_errors_total",
			Help: "Requests answered with an error, by operation and error code.",
		}, []string{"op", "code"}),
	}
	if admissions {
		r.admitted = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpu_admissions_total",
			Help: "Containers admitted (registrations granted).",
		})
		r.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_admission_rejections_total",
			Help: "Containers refused at admission, by error code (quota_exceeded: over the tenant's caps).",
		}, []string{"code"})
	}
	return r
}

// opName is op's label value: api's name of it, or "unknown".
func opName(op wire.Op) string {
	if s := op.String(); !strings.HasPrefix(s, "op(") {
		return s
	}
	return "unknown"
}

// codeName is code's label value: its name in snake case.
func codeName(code api.Code) string {
	if code >= codeSlots {
		return "unknown"
	}
	return strings.ReplaceAll(code.String(), " ", "_")
}

// Replied implements wire.ReplyObserver.
func (r *Requests) Replied(op wire.Op, took time.Duration, code api.Code) {
	slot := &r.byOp[min(int(op), opSlots-1)]
	h := slot.Load()
	if h == nil {
		// Two first replies may race here; both get the same histogram.
		o := r.latency.WithLabelValues(opName(min(op, opSlots-1)))
		slot.Store(&o)
		h = &o
	}
	(*h).Observe(took.Seconds())
	if code != api.CodeOK {
		r.errors.WithLabelValues(opName(op), codeName(code)).Inc()
	}
	if op == api.OpRegister && r.admitted != nil {
		if code == api.CodeOK {
			r.admitted.Inc()
		} else {
			r.refused.WithLabelValues(codeName(code)).Inc()
		}
	}
}

// Describe implements prometheus.Collector.
func (r *Requests) Describe(ch chan<- *prometheus.Desc) {
	r.latency.Describe(ch)
	r.errors.Describe(ch)
	if r.admitted != nil {
		r.admitted.Describe(ch)
		r.refused.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (r *Requests) Collect(ch chan<- prometheus.Metric) {
	r.latency.Collect(ch)
	r.errors.Collect(ch)
	if r.admitted != nil {
		r.admitted.Collect(ch)
		r.refused.Collect(ch)
	}
}
