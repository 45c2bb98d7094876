package mediator

import (
	"math"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// Stream ids wrap around after 2^32 creations; a new id must never replace
// a live stream (the default one included), which would leak its goroutines
// and strand its queued commands.
func TestStreamIDsSkipLiveStreams(t *testing.T) {
	s := &session{streams: streamSet{byID: map[uint32]*stream{}, next: math.MaxUint32}}
	def := s.newStream(api.DefaultStream)
	s.streams.byID[api.DefaultStream] = def
	one := s.newStream(1)
	s.streams.byID[1] = one
	defer func() {
		for _, st := range s.streams.byID {
			st.stop()
		}
	}()
	var ids []uint32
	for range 2 {
		id, err := s.streams.create(s.newStream)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if ids[0] != math.MaxUint32 || ids[1] != 2 {
		t.Fatalf("ids after wrapping = %v, want [%d 2]", ids, uint32(math.MaxUint32))
	}
	if s.streams.byID[api.DefaultStream] != def || s.streams.byID[1] != one {
		t.Fatal("a new stream replaced a live one")
	}
}
