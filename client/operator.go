package client

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// DefaultOperatorTimeout is how long an Operator of DialOperator waits for
// each answer of the mediator, the hello's included: one that does not
// answer (wedged, or stopped) must not hang vgpuctl or the runtime hook.
const DefaultOperatorTimeout = 30 * time.Second

// Operator is an operator's connection to a mediator: status, catalog and
// admission (admission.go).
type Operator struct {
	rpc     *wire.RPC
	socket  string
	timeout time.Duration // for each call
}

// DialOperator connects to the mediator at socket as an operator, with
// DefaultOperatorTimeout.
func DialOperator(socket string) (*Operator, error) {
	return DialOperatorTimeout(socket, DefaultOperatorTimeout)
}

// DialOperatorTimeout connects to the mediator at socket as an operator.
// The hello and each later call must be answered within timeout; one that
// is not fails with an error that says so and wraps api.ErrUnavailable, and
// closes the connection.
func DialOperatorTimeout(socket string, timeout time.Duration) (*Operator, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("operator timeout %v: want more than 0: %w", timeout, api.ErrInvalidArgument)
	}
	if socket == "" {
		socket = DefaultSocket
	}
	rpc, _, err := dial(socket, api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator}, timeout)
	if err != nil {
		return nil, err
	}
	return &Operator{rpc: rpc, socket: socket, timeout: timeout}, nil
}

// call sends a request and waits for its reply body, within o.timeout.
func (o *Operator) call(op wire.Op, parts ...[]byte) ([]byte, error) {
	var body []byte
	err := answeredWithin(o.rpc, o.socket, op, o.timeout, func() (err error) {
		body, err = o.rpc.Call(op, nil, parts...)
		return err
	})
	return body, err
}

// Close closes the connection.
func (o *Operator) Close() error { return o.rpc.Close() }

// Status reports the mediator's nodes, devices and tenants.
func (o *Operator) Status() (*api.Status, error) {
	body, err := o.call(api.OpStatus)
	if err != nil {
		return nil, err
	}
	var st api.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("status reply: %v: %w", err, api.ErrProtocol)
	}
	return &st, nil
}

// Kernels lists the kernels the mediator's nodes offer.
func (o *Operator) Kernels() ([]api.KernelInfo, error) {
	var ks []api.KernelInfo
	err := answeredWithin(o.rpc, o.socket, api.OpKernels, o.timeout, func() (err error) {
		ks, err = kernels(o.rpc)
		return err
	})
	return ks, err
}

// Self reports, over a container's own socket, what that container has:
// its grant, virtual devices, tenant limits and sessions. On the host
// socket the mediator refuses it; in a container, it is all the mediator
// answers besides Kernels.
func (o *Operator) Self() (*api.SelfStatus, error) {
	body, err := o.call(api.OpSelf)
	if err != nil {
		return nil, err
	}
	var st api.SelfStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("self reply: %v: %w", err, api.ErrProtocol)
	}
	return &st, nil
}
