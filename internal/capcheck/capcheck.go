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
