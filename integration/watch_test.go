package integration

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/vgpu/vgpu/api"
)

func TestContainerGone(t *testing.T) {
	log, _ := logtest.NewNullLogger()
	env := func(ns, topic string, ev any) *events.Envelope {
		a, err := typeurl.MarshalAny(ev)
		if err != nil {
			t.Fatal(err)
		}
		return &events.Envelope{Namespace: ns, Topic: topic, Event: a}
	}
	tests := []struct {
		name    string
		env     *events.Envelope
		wantID  string // "" when the event is not a container's end
		wantPid uint32
	}{
		{"init exit", env("k8s.io", TopicTaskExit, &apievents.TaskExit{ContainerID: "c1", ID: "c1", Pid: 42}), "c1", 42},
		{"exec exit", env("k8s.io", TopicTaskExit, &apievents.TaskExit{ContainerID: "c1", ID: "exec-1", Pid: 43}), "", 0},
		{"task delete", env("k8s.io", TopicTaskDelete, &apievents.TaskDelete{ContainerID: "c1", ID: "c1", Pid: 42}), "c1", 42},
		{"task delete without id", env("k8s.io", TopicTaskDelete, &apievents.TaskDelete{ContainerID: "c1"}), "c1", 0},
		{"exec delete", env("k8s.io", TopicTaskDelete, &apievents.TaskDelete{ContainerID: "c1", ID: "exec-1"}), "", 0},
		{"container delete", env("k8s.io", TopicContainerDelete, &apievents.ContainerDelete{ID: "c1"}), "c1", 0},
		{"other event", env("k8s.io", "/tasks/start", &apievents.TaskStart{ContainerID: "c1", Pid: 42}), "", 0},
		{"empty id", env("k8s.io", TopicContainerDelete, &apievents.ContainerDelete{}), "", 0},
		{"no event", &events.Envelope{Namespace: "k8s.io", Topic: TopicTaskExit}, "", 0},
		{"undecodable", &events.Envelope{Namespace: "k8s.io", Topic: TopicTaskExit, Event: typeurl.MarshalProto(mustAny(t))}, "", 0},
		{"nil", nil, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := containerGone(tc.env, log)
			if ok != (tc.wantID != "") || g.ID != tc.wantID || g.Pid != tc.wantPid || ok && g.Namespace != "k8s.io" {
				t.Errorf("containerGone = %+v, %v; want id %q, pid %d", g, ok, tc.wantID, tc.wantPid)
			}
		})
	}
}

// mustAny is an Any of a type nobody registered.
func mustAny(t *testing.T) typeurl.Any {
	a, err := typeurl.MarshalAny(&apievents.TaskExit{ContainerID: "x", ID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	p := typeurl.MarshalProto(a)
	p.TypeUrl = "example.com/not.a.Type"
	return p
}

func TestWatchContainerdArguments(t *testing.T) {
	ctx := context.Background()
	if err := WatchContainerd(ctx, "", nil, func(Gone) {}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("empty address: %v", err)
	}
	if err := WatchContainerd(ctx, "/run/containerd/containerd.sock", nil, nil); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("nil gone: %v", err)
	}
}

// TestWatchContainerdAbsent: with no containerd the watcher waits quietly
// (one warning, a handful of attempts) and returns at once when ctx ends.
func TestWatchContainerdAbsent(t *testing.T) {
	tests := []struct {
		name   string
		socket func(t *testing.T) string
	}{
		{"no socket", func(t *testing.T) string { return filepath.Join(t.TempDir(), "containerd.sock") }},
		{"stale socket", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "containerd.sock")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
			return p
		}},
		{"unix:// address", func(t *testing.T) string { return "unix://" + filepath.Join(t.TempDir(), "containerd.sock") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, hook := logtest.NewNullLogger()
			log.SetLevel(logrus.DebugLevel)
			sock := tc.socket(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- WatchContainerd(ctx, sock, log, func(g Gone) { t.Errorf("gone(%+v) without containerd", g) })
			}()
			time.Sleep(1500 * time.Millisecond)
			start := time.Now()
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("WatchContainerd = %v, want context.Canceled", err)
				}
				if d := time.Since(start); d > 500*time.Millisecond {
					t.Errorf("returned %v after cancel", d)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("WatchContainerd did not return after cancel")
			}
			warns, attempts := 0, 0
			for _, e := range hook.AllEntries() {
				switch e.Level {
				case logrus.WarnLevel:
					warns++
				case logrus.DebugLevel:
					attempts++
				case logrus.InfoLevel:
					t.Errorf("info without containerd: %s", e.Message)
				}
			}
			// Backoff 200, 400, 800 ms: 3 or 4 attempts in 1.5 s.
			if warns != 1 || attempts > 5 {
				t.Errorf("%d warnings, %d further attempts in 1.5 s; want 1 warning and a backoff", warns, attempts)
			}
		})
	}
}

// fakeContainerd serves containerd's events and version services, enough
// for the watcher, and lets the test send events.
type fakeContainerd struct {
	eventsapi.UnimplementedEventsServer
	versionapi.UnimplementedVersionServer

	mu         sync.Mutex
	subs       map[chan *types.Envelope]bool
	filters    []string
	subscribed chan struct{}
}

func newFakeContainerd() *fakeContainerd {
	return &fakeContainerd{subs: map[chan *types.Envelope]bool{}, subscribed: make(chan struct{}, 16)}
}

// serve serves on the unix socket path until the returned stop is called.
func (f *fakeContainerd) serve(t *testing.T, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	eventsapi.RegisterEventsServer(s, f)
	versionapi.RegisterVersionServer(s, f)
	go s.Serve(l)
	return s.Stop
}

func (f *fakeContainerd) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	return &versionapi.VersionResponse{Version: "fake", Revision: "0"}, nil
}

func (f *fakeContainerd) Subscribe(req *eventsapi.SubscribeRequest, ss eventsapi.Events_SubscribeServer) error {
	ch := make(chan *types.Envelope, 16)
	f.mu.Lock()
	f.subs[ch] = true
	f.filters = req.Filters
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}()
	f.subscribed <- struct{}{}
	for {
		select {
		case <-ss.Context().Done():
			return nil
		case e := <-ch:
			if err := ss.Send(e); err != nil {
				return err
			}
		}
	}
}

func (f *fakeContainerd) send(t *testing.T, ns, topic string, ev any) {
	t.Helper()
	a, err := typeurl.MarshalAny(ev)
	if err != nil {
		t.Fatal(err)
	}
	env := &types.Envelope{Namespace: ns, Topic: topic, Event: typeurl.MarshalProto(a)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.subs) == 0 {
		t.Fatal("no subscriber")
	}
	for ch := range f.subs {
		ch <- env
	}
}

// TestWatchContainerdFake runs the watcher against a fake containerd: it
// decodes and filters events, reconnects after containerd restarts and
// logs once per change of state.
func TestWatchContainerdFake(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	f := newFakeContainerd()
	stop := f.serve(t, sock)
	defer func() { stop() }()

	log, hook := logtest.NewNullLogger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := make(chan string, 16)
	connected := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- watchContainerd(ctx, sock, log, func(g Gone) { gone <- g.Namespace + "/" + g.ID }, func() { connected <- struct{}{} })
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10 s", what)
		}
	}
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-gone:
			if got != want {
				t.Fatalf("gone(%s), want gone(%s)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no gone(%s) within 5 s", want)
		}
	}
	wait(connected, "connection")
	wait(f.subscribed, "subscription")
	f.mu.Lock()
	if want := []string{`topic=="/tasks/exit"`, `topic=="/tasks/delete"`, `topic=="/containers/delete"`}; !reflect.DeepEqual(f.filters, want) {
		t.Errorf("filters %q, want %q", f.filters, want)
	}
	f.mu.Unlock()

	// Events arrive in order, so an ignored event is known to be ignored
	// once the next one has been reported.
	f.send(t, "k8s.io", TopicTaskExit, &apievents.TaskExit{ContainerID: "c1", ID: "exec-1", Pid: 7})
	f.send(t, "k8s.io", "/tasks/start", &apievents.TaskStart{ContainerID: "c1", Pid: 6})
	f.send(t, "k8s.io", TopicTaskExit, &apievents.TaskExit{ContainerID: "c1", ID: "c1", Pid: 6})
	expect("k8s.io/c1")
	f.send(t, "k8s.io", TopicTaskDelete, &apievents.TaskDelete{ContainerID: "c1", ID: "c1", Pid: 6})
	expect("k8s.io/c1")
	f.send(t, "moby", TopicContainerDelete, &apievents.ContainerDelete{ID: "c2"})
	expect("moby/c2")

	// containerd restarts: the watcher notices, waits, reconnects.
	stop()
	time.Sleep(1200 * time.Millisecond)
	stop = f.serve(t, sock)
	wait(connected, "reconnection")
	wait(f.subscribed, "new subscription")
	f.send(t, "default", TopicContainerDelete, &apievents.ContainerDelete{ID: "c3"})
	expect("default/c3")

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WatchContainerd = %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("WatchContainerd did not return after cancel")
	}
	var infos, warns []string
	for _, e := range hook.AllEntries() {
		switch e.Level {
		case logrus.InfoLevel:
			infos = append(infos, e.Message)
		case logrus.WarnLevel:
			warns = append(warns, e.Message)
		}
	}
	if len(infos) != 2 || len(warns) != 1 || !strings.Contains(warns[0], "lost containerd") {
		t.Errorf("logged infos %q, warnings %q; want one per change of state: connected, lost, connected", infos, warns)
	}
	select {
	case g := <-gone:
		t.Errorf("unexpected gone(%s)", g)
	default:
	}
}
