// Package pkitest checks TLS configurations against each other in tests:
// it owns one loopback handshake, shared by the tests of the packages that
// build those configurations.
package pkitest

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// Handshake runs a TLS server with srv on loopback and a client with cli
// dialling addrHost, and returns both sides' errors; it fails t if the
// server cannot listen. A successful server writes one byte, which the
// client reads: in TLS 1.3 the client learns that the server refused its
// certificate only when it reads.
func Handshake(t testing.TB, srv, cli *tls.Config, addrHost string) (srvErr, cliErr error) {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := c.(*tls.Conn).Handshake(); err != nil {
			done <- err
			return
		}
		_, err = c.Write([]byte{1})
		done <- err
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	c, cerr := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(addrHost, port), cli)
	if cerr == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, cerr = io.ReadFull(c, make([]byte, 1))
		c.Close()
	}
	return <-done, cerr
}
