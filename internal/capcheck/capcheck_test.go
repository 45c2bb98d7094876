package capcheck

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name    string
		history []Event
		over    bool
		peak    uint64
	}{
		{"sequential", []Event{{"t", 60, at(0), at(10)}, {"t", 60, at(10), at(20)}}, false, 60},
		{"overlap within", []Event{{"t", 50, at(0), at(10)}, {"t", 50, at(5), at(20)}}, false, 100},
		{"overlap past", []Event{{"t", 60, at(0), at(10)}, {"t", 60, at(5), time.Time{}}}, true, 120},
		{"other tenant", []Event{{"t", 60, at(0), at(10)}, {"u", 60, at(5), at(20)}}, false, 60},
		{"never released", []Event{{"t", 90, at(0), time.Time{}}, {"t", 20, at(50), at(60)}}, true, 110},
	} {
		v, peak := Check(tc.history, 100)
		if (v != "") != tc.over || peak != tc.peak {
			t.Errorf("%s: violation %q, peak %d; want over %v, peak %d", tc.name, v, peak, tc.over, tc.peak)
		}
	}
}
