package statuspage

import (
	"sync"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// OperatorSource is a Source that asks a mediator over its operator
// socket, as vgpuctl does. It dials on first use, and again after a call
// fails (the mediator restarted, or closed the connection), so that one
// broken connection does not end the page's updates.
type OperatorSource struct {
	socket  string
	timeout time.Duration

	mu sync.Mutex
	op *client.Operator // guarded by mu; nil until dialled, and after a failed call
}

// NewOperatorSource returns a source for the mediator at socket, each call
// answered within timeout.
func NewOperatorSource(socket string, timeout time.Duration) *OperatorSource {
	return &OperatorSource{socket: socket, timeout: timeout}
}

// Status is the mediator's status, as vgpuctl status shows it.
func (s *OperatorSource) Status() (*api.Status, error) {
	return ask(s, (*client.Operator).Status)
}

// Tenants is the mediator's tenants, as vgpuctl tenants shows them.
func (s *OperatorSource) Tenants() ([]api.TenantInfo, error) {
	return ask(s, (*client.Operator).Tenants)
}

// ask makes one call on s's connection, dialling first if it has none, and
// drops the connection when the call fails.
func ask[T any](s *OperatorSource, call func(*client.Operator) (T, error)) (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var zero T
	if s.op == nil {
		op, err := client.DialOperatorTimeout(s.socket, s.timeout)
		if err != nil {
			return zero, err
		}
		s.op = op
	}
	v, err := call(s.op)
	if err != nil {
		s.op.Close()
		s.op = nil
		return zero, err
	}
	return v, nil
}

// Close closes the connection, if one is open.
func (s *OperatorSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.op == nil {
		return nil
	}
	err := s.op.Close()
	s.op = nil
	return err
}
