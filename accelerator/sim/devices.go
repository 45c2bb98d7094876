package sim

import (
	"errors"
	"fmt"

	"github.com/vgpu/vgpu/api"
)

// NewDevices creates n devices of size bytes each, indexed from 0.
func NewDevices(n int, size uint64) ([]*Device, error) {
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("%d sim devices: want 1 to 64: %w", n, api.ErrInvalidArgument)
	}
	devs := make([]*Device, 0, n)
	for i := range n {
		d, err := New(uint32(i), size)
		if err != nil {
			for _, d := range devs {
				err = errors.Join(err, d.Close())
			}
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}
