package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
)

// Timing of the containerd watcher.
const (
	// watchTimeout bounds one connection attempt and its first call.
	watchTimeout = 5 * time.Second
	// watchMinBackoff and watchMaxBackoff bound the wait between attempts:
	// it doubles from the first to the second while containerd stays away
	// and starts again from the first after a good connection.
	watchMinBackoff = 200 * time.Millisecond
	watchMaxBackoff = 5 * time.Second
)

// The events that end a container's life, as containerd event filters.
// Filters given together are alternatives.
const (
	TopicTaskExit        = "/tasks/exit"
	TopicTaskDelete      = "/tasks/delete"
	TopicContainerDelete = "/containers/delete"
)

var watchFilters = []string{
	`topic=="` + TopicTaskExit + `"`,
	`topic=="` + TopicTaskDelete + `"`,
	`topic=="` + TopicContainerDelete + `"`,
}

// Gone is a container that containerd reports ended: its namespace, id
// and, where the event says (a task's exit or delete), its init process's
// pid, else 0.
type Gone struct {
	Namespace, ID string
	Pid           uint32
}

// WatchContainerd follows the events of the containerd at address (a socket
// path, with or without "unix://") in every namespace, and calls gone
// when a container ends: its init process exited (/tasks/exit whose
// process is the container's own; an exec'd
// process that exits is not the container's end), its task was deleted
// (/tasks/delete) or its record was deleted (/containers/delete). So the
// mediator learns within a moment of containers that vanished without a
// poststop hook and reclaims what they held.
//
// gone runs on the watcher's goroutine, one call at a time, and should be
// quick. It must be idempotent: one container's end is usually reported
// more than once (exit, then task delete, then container delete), and a
// container that is started again and exits again is reported again.
//
// While containerd is away (not installed, not started, restarting) the
// watcher retries with a backoff of up to 5 s, and logs once per change of
// state: once when it cannot reach containerd, once when it (re)connects.
// It returns ctx.Err() when ctx ends, and at once an error matching
// api.ErrInvalidArgument when address is empty or gone is nil. A nil log
// logs through logrus's standard logger.
func WatchContainerd(ctx context.Context, address string, log logrus.FieldLogger, gone func(Gone)) error {
	return watchContainerd(ctx, address, log, gone, nil)
}

// watchContainerd is WatchContainerd; connected, when not nil, is called
// after each successful connection (tests wait on it).
func watchContainerd(ctx context.Context, address string, log logrus.FieldLogger, gone func(Gone), connected func()) error {
	if address == "" {
		return fmt.Errorf("containerd address is empty: %w", api.ErrInvalidArgument)
	}
	if gone == nil {
		return fmt.Errorf("watch containerd at %s: no gone function: %w", address, api.ErrInvalidArgument)
	}
	if log == nil {
		log = logrus.StandardLogger()
	}
	log = log.WithField("containerd", address)
	const (
		unknown = iota
		up
		down
	)
	state := unknown
	backoff := watchMinBackoff
	for {
		err := watchOnce(ctx, strings.TrimPrefix(address, "unix://"), log, gone, func() {
			if state != up {
				log.Info("watching containerd events: containers that end without a poststop hook are released")
			}
			state = up
			backoff = watchMinBackoff
			if connected != nil {
				connected()
			}
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch state {
		case up:
			log.WithError(err).Warn("lost containerd's event stream; reconnecting quietly (the next message says when it is back)")
		case unknown:
			log.WithError(err).Warn("containerd is not reachable; retrying quietly (the next message says when it is reachable)")
		default:
			log.WithError(err).Debug("containerd still not reachable")
		}
		state = down
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, watchMaxBackoff)
	}
}

// watchOnce connects, subscribes and delivers events until the stream or
// ctx ends. It calls connected once containerd has answered.
func watchOnce(ctx context.Context, path string, log logrus.FieldLogger, gone func(Gone), connected func()) error {
	// containerd's dialer re-dials a missing socket every 10 ms until its
	// timeout; a stat is cheaper and says the same.
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("containerd socket: %w: %w", err, api.ErrUnavailable)
	}
	c, err := client.New(path, client.WithTimeout(watchTimeout))
	if err != nil {
		return fmt.Errorf("connect to containerd: %w: %w", err, api.ErrUnavailable)
	}
	defer c.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evs, errs := c.Subscribe(sctx, watchFilters...)
	// The event stream says nothing until the first event; a plain call
	// tells whether containerd answers.
	vctx, vcancel := context.WithTimeout(ctx, watchTimeout)
	_, err = c.Version(vctx)
	vcancel()
	if err != nil {
		return fmt.Errorf("containerd version: %w: %w", err, api.ErrUnavailable)
	}
	connected()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			if err == nil {
				err = errors.New("event stream closed")
			}
			return fmt.Errorf("containerd events: %w: %w", err, api.ErrUnavailable)
		case env := <-evs:
			if g, ok := containerGone(env, log); ok {
				gone(g)
			}
		}
	}
}

// containerGone decodes an envelope and tells which container, if any, it
// says has ended.
func containerGone(env *events.Envelope, log logrus.FieldLogger) (Gone, bool) {
	if env == nil || env.Event == nil {
		return Gone{}, false
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		log.WithError(err).WithField("topic", env.Topic).Debug("undecodable containerd event")
		return Gone{}, false
	}
	g := Gone{Namespace: env.Namespace}
	switch e := v.(type) {
	case *apievents.TaskExit:
		// The init process's ID is the container's; an exec's is its own.
		if e.ID != e.ContainerID {
			return Gone{}, false
		}
		g.ID, g.Pid = e.ContainerID, e.Pid
	case *apievents.TaskDelete:
		if e.ID != "" && e.ID != e.ContainerID {
			return Gone{}, false
		}
		g.ID, g.Pid = e.ContainerID, e.Pid
	case *apievents.ContainerDelete:
		g.ID = e.ID
	default:
		return Gone{}, false
	}
	if g.ID == "" {
		return Gone{}, false
	}
	return g, true
}
