package accelerator

import (
	"fmt"
	"net"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator/sim"
)

// StartSim starts a node with n simulated devices of size bytes each,
// serving on addr (host:port; port 0 picks one). It is the embedded default
// of a mediator with no --node, and the test harness's node. Stop it with
// Close.
func StartSim(addr string, n int, size uint64, log logrus.FieldLogger) (*Node, net.Addr, error) {
	devs, err := sim.NewDevices(n, size)
	if err != nil {
		return nil, nil, err
	}
	ds := make([]Device, len(devs))
	for i, d := range devs {
		ds[i] = d
	}
	node, err := New("sim", ds, log)
	if err != nil {
		for _, d := range devs {
			d.Close()
		}
		return nil, nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		node.Close()
		return nil, nil, fmt.Errorf("node listen on %s: %w", addr, err)
	}
	go func() {
		if err := node.Serve(l); err != nil {
			log.WithError(err).Error("node stopped serving")
		}
	}()
	return node, l.Addr(), nil
}
