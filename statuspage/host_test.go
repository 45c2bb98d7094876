package statuspage

import "testing"

// Only a loopback name or address is a loopback host: a DNS-rebinding page
// sends its own name, which may start or end like one.
func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "localhost:8080": true, "127.0.0.1": true, "127.0.0.1:80": true, "127.1.2.3:80": true,
		"[::1]": true, "[::1]:8080": true, "::1": true,
		"": false, "evil.example": false, "127.0.0.1.evil.example": false, "127.0.0.1.evil.example:80": false,
		"localhost.evil.example": false, "evil.localhost": false, "localhost@evil.example": false,
		"10.0.0.1:80": false, "0.0.0.0:80": false, "[::]:80": false, "[::1%25lo]:80": false, "0x7f000001": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
