package wire

import (
	"net"
	"testing"
)

// BenchmarkRPCSmallCall times one small call at a time over a loopback TCP
// connection to an echo server in this process, for both ways of reading
// replies, beside the same exchange by hand (write a frame, read the reply
// on the calling goroutine) as the baseline:
//
//	go test -run xxx -bench RPCSmallCall ./api/
func BenchmarkRPCSmallCall(b *testing.B) {
	body := []byte("small request")
	b.Run("by-hand", func(b *testing.B) {
		nc, err := net.Dial("tcp", serve(b, echo))
		if err != nil {
			b.Fatal(err)
		}
		c := NewConn(nc)
		defer c.Close()
		reply := make([]byte, len(body))
		for i := 0; b.Loop(); i++ {
			if err := c.WriteFrame(opFree, 0, uint64(i), body); err != nil {
				b.Fatal(err)
			}
			h, err := c.ReadHeader()
			if err != nil || int(h.Len) != len(body) {
				b.Fatal(h, err)
			}
			if err := c.ReadBody(reply); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, m := range rpcModes {
		b.Run(m.name, func(b *testing.B) {
			r := m.dial(b, serve(b, echo))
			for b.Loop() {
				if _, err := r.Call(opFree, nil, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
