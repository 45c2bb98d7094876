package mediator

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
	"github.com/vgpu/vgpu/client"
)

// helloResume says a tenant's hello on socket that resumes the session of
// token, as tenant ("": whichever the session's is).
func helloResume(t *testing.T, socket, tenant, token string) error {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	r := wire.NewRPC(wire.NewConn(nc), "mediator")
	defer r.Close()
	_, err = r.Call(api.OpHello, nil, api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleTenant,
		Tenant: tenant, Resumable: true, Resume: token}))
	return err
}

// A restored session is taken up only with its token, through the socket
// it was opened on, as its own tenant: a guessed token, a token with
// another tenant's name, or a token through another socket (the host's,
// another container's) is refused, and none of them uses the session up:
// its own client resumes it afterwards with its bytes, and once it has,
// the token takes over nothing (a live session is never handed to a
// second connection).
func TestResumeOnlyByItsOwner(t *testing.T) {
	h := newHost(t)
	h.start()
	hostSock := h.serveHost()
	a := h.register(api.Register{Container: "a", Namespace: "moby", Memory: 16 << 20, Pid: uint32(sleeper(t).Process.Pid)})  // team-a
	b := h.register(api.Register{Container: "b", Namespace: "other", Memory: 16 << 20, Pid: uint32(sleeper(t).Process.Pid)}) // b

	type owned struct {
		c     *client.Client
		p     client.Ptr
		token string
	}
	open := func(o client.Options, seed byte) *owned {
		c, err := client.Dial(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p, err := c.Malloc(0, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		c.Stream().CopyToDevice(p, pattern(seed, 64<<10))
		if err := c.Stream().Synchronize(); err != nil {
			t.Fatal(err)
		}
		h.med.mu.Lock()
		tok := h.med.sessions[c.Session()].token
		h.med.mu.Unlock()
		if len(tok) != 64 {
			t.Fatalf("session token %q, want 32 random bytes in hex", tok)
		}
		return &owned{c: c, p: p, token: tok}
	}
	onHost := open(client.Options{Socket: hostSock, Tenant: "shared"}, 1)
	inA := open(client.Options{Socket: a.Socket}, 2)

	h.crash()
	if out := h.start(); !strings.Contains(out, "restored=2") {
		t.Fatalf("restart log does not restore both sessions:\n%s", out)
	}
	h.serveHost()

	guess := make([]byte, 32)
	rand.Read(guess)
	for _, c := range []struct {
		what, socket, tenant, token string
		want                        error
		says                        string
	}{
		{"a guessed token", hostSock, "", hex.EncodeToString(guess), api.ErrUnavailable, "no session to resume"},
		{"the host session's token as tenant team-a", hostSock, "team-a", onHost.token, api.ErrPermissionDenied, `not "team-a"`},
		{"the host session's token through container a's socket", a.Socket, "", onHost.token, api.ErrPermissionDenied, "another socket"},
		{"container a's token through container b's socket", b.Socket, "", inA.token, api.ErrPermissionDenied, "another socket"},
		{"container a's token through the host socket", hostSock, "shared", inA.token, api.ErrPermissionDenied, "another socket"},
		{"container a's token through its socket as tenant b", a.Socket, "b", inA.token, api.ErrPermissionDenied, `not "b"`},
	} {
		err := helloResume(t, c.socket, c.tenant, c.token)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.what, err, c.want, c.says)
		}
		if strings.Contains(err.Error(), c.token) {
			t.Errorf("%s: the refusal repeats the token: %v", c.what, err)
		}
	}

	for i, o := range []*owned{onHost, inA} {
		got := make([]byte, 64<<10)
		o.c.Stream().CopyFromDevice(got, o.p)
		if err := o.c.Stream().Synchronize(); err != nil || !bytes.Equal(got, pattern(byte(i+1), 64<<10)) {
			t.Fatalf("session %d resumed by its own client: %v, bytes equal %v", i, err, bytes.Equal(got, pattern(byte(i+1), 64<<10)))
		}
		sock := hostSock
		if o == inA {
			sock = a.Socket
		}
		if err := helloResume(t, sock, "", o.token); !errors.Is(err, api.ErrUnavailable) {
			t.Errorf("session %d's token again once its client resumed it: %v, want unavailable", i, err)
		}
		if _, err := o.c.Stats(); err != nil {
			t.Fatalf("session %d after its token was presented again: %v", i, err)
		}
	}
	if logs := h.log.String(); strings.Contains(logs, onHost.token) || strings.Contains(logs, inA.token) {
		t.Errorf("a session token is in the mediator's log")
	}
}
