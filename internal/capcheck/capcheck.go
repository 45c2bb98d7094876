// Package capcheck checks a recorded history of admissions against a cap:
// did a tenant ever hold more than its cap at once? Tests of cluster-wide
// quotas record what they were granted and when, and this says whether the
// record proves an over-admission.
//
// An admission is certainly held from the moment its grant returned until
// the moment its release was called; outside that interval it may or may
// not be held. The check counts only certain holding, so it never reports
// an over-admission that did not happen (no false alarm from timing), and
// finds one whenever two grants' certain intervals overlap past the cap.
package capcheck

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
)

// Event is one admission of a tenant's memory.
type Event struct {
	Tenant string
	Memory uint64
	// Got is when the grant returned; Put when its release was called
	// (zero: never released).
	Got, Put time.Time
}

// Check returns, described, the first moment at which a tenant's
// admissions certainly held then passed limit ("" for none), and the
// largest sum certainly held at once, over all tenants.
func Check(history []Event, limit uint64) (violation string, peak uint64) {
	for _, e := range history {
		var sum uint64
		var held []string
		for _, o := range history {
			if o.Tenant == e.Tenant && !o.Got.After(e.Got) && (o.Put.IsZero() || o.Put.After(e.Got)) {
				sum += o.Memory
				held = append(held, api.FormatSize(o.Memory))
			}
		}
		peak = max(peak, sum)
		if sum > limit && violation == "" {
			violation = fmt.Sprintf("tenant %q held %s at once (%s), cap %s", e.Tenant, api.FormatSize(sum), strings.Join(held, "+"), api.FormatSize(limit))
		}
	}
	return violation, peak
}

// Require fails tb unless history shows what a test of admissions under
// one tenant's cap must: with planted (admissions that do not share
// reservations, a bug on purpose) an over-admission, which Check must
// catch; without, none, while the cap was contended — some admissions
// refused and at least half the cap certainly held at once — for a check
// that never came near the cap proves nothing.
func Require(tb testing.TB, history []Event, limit uint64, refused int, planted bool) {
	tb.Helper()
	violation, peak := Check(history, limit)
	tb.Logf("%d admitted, %d refused for the cap; peak certainly held at once %s of %s",
		len(history), refused, api.FormatSize(peak), api.FormatSize(limit))
	switch {
	case planted && violation == "":
		tb.Fatalf("the planted over-admission was not caught: peak %s", api.FormatSize(peak))
	case planted:
		tb.Logf("caught: %s", violation)
	case violation != "":
		tb.Fatal(violation)
	case refused == 0 || peak < limit/2:
		tb.Fatalf("the cap was not contended (%d refused, peak %s): the check proves nothing", refused, api.FormatSize(peak))
	}
}
