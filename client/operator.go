package client

import (
	"encoding/json"
	"fmt"

	"github.com/vgpu/vgpu/api"
)

// Operator is an operator's connection to a mediator: status and catalog.
type Operator struct{ rpc *api.RPC }

// DialOperator connects to the mediator at socket as an operator.
func DialOperator(socket string) (*Operator, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	rpc, _, err := dial(socket, api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator})
	if err != nil {
		return nil, err
	}
	return &Operator{rpc: rpc}, nil
}

// Close closes the connection.
func (o *Operator) Close() error { return o.rpc.Close() }

// Status reports the mediator's nodes, devices and tenants.
func (o *Operator) Status() (*api.Status, error) {
	body, err := o.rpc.Call(api.OpStatus, nil)
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
func (o *Operator) Kernels() ([]api.KernelInfo, error) { return kernels(o.rpc) }
