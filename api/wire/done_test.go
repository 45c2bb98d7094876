package wire

import (
	"testing"
	"time"
)

// TestCallDoneOnDemand: a call that completes through its continuation,
// or through a Wait that reads its reply itself, makes no done channel; a
// Done asked for before the call completes closes when it does, and one
// asked for after is closed already.
func TestCallDoneOnDemand(t *testing.T) {
	for _, m := range rpcModes {
		t.Run(m.name, func(t *testing.T) {
			release := make(chan struct{})
			r := m.dial(t, serve(t, func(c *Conn) {
				for {
					h, body, err := readFrame(c)
					if err != nil {
						return
					}
					if string(body) == "hold" {
						<-release
					}
					if err := c.Reply(h, body); err != nil {
						return
					}
				}
			}))

			ran := make(chan struct{})
			c := r.GoThen(opFree, nil, func(*Call) { close(ran) }, []byte("x"))
			if m.name == "caller-reads" {
				if err := waitCall(t, c); err != nil { // the waiter reads the reply itself
					t.Fatal(err)
				}
			}
			select {
			case <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("continuation never ran")
			}
			for !isDone(c) { // over is set just after the continuation returns
				time.Sleep(time.Millisecond)
			}
			c.mu.Lock()
			made := c.done != nil
			c.mu.Unlock()
			if made {
				t.Fatal("a call nobody asked Done of made a done channel")
			}
			select {
			case <-c.Done():
			default:
				t.Fatal("Done of a completed call is not closed")
			}

			held := r.Go(opFree, nil, []byte("hold"))
			done := held.Done()
			select {
			case <-done:
				t.Fatal("Done closed before the reply was sent")
			case <-time.After(20 * time.Millisecond):
			}
			close(release)
			if err := waitCall(t, held); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			default:
				t.Fatal("Done asked for before completion did not close on it")
			}
		})
	}
}

// TestGoThenInUsesCallersCall: GoThenIn completes the caller's own Call,
// reply and continuation included, rather than one of its own.
func TestGoThenInUsesCallersCall(t *testing.T) {
	for _, m := range rpcModes {
		t.Run(m.name, func(t *testing.T) {
			r := m.dial(t, serve(t, echo))
			var own Call
			var seen *Call
			c := r.GoThenIn(&own, opFree, nil, func(c *Call) { seen = c }, []byte("mine"))
			if c != &own {
				t.Fatalf("GoThenIn returned %p, not the caller's call %p", c, &own)
			}
			if err := waitCall(t, c); err != nil {
				t.Fatal(err)
			}
			if seen != &own || string(own.Body) != "mine" {
				t.Fatalf("continuation saw %p (want %p), reply %q (want %q)", seen, &own, own.Body, "mine")
			}
		})
	}
}
