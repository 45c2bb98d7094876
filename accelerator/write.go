package accelerator

// Bulk writes straight into device memory.
//
// A write that finds nothing of its connection queued or running is
// executed by the reader as its frame arrives: it reads the fields in front
// of the payload (api.NodeAccess without Payload), checks them, and then
// reads the payload from the connection into the device memory of the
// write's extents (Device.WriteFrom), with no buffer in between. A write
// that must wait for earlier requests is read whole into a buffer and
// executed in turn (doAccess), as any other request.
//
// Invariants:
//   - The reader consumes every byte of the frame whatever the outcome, so
//     the stream stays in step; a refused write's payload is discarded.
//   - A read error of the connection, before or during the payload, ends
//     the connection (the stream can no longer be in step). The write's
//     extents may then hold part of the payload, as with any write that was
//     not acknowledged.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// writePrefixLen returns the length of the fields in front of the payload
// of a write whose body is n bytes, from the body's first 8 bytes (device
// u32, extent count u32): the count's extents of 16 bytes and the value
// byte follow. The count must fit wire.MaxList and the body.
func writePrefixLen(head [8]byte, n uint32) (int, error) {
	count := binary.LittleEndian.Uint32(head[4:])
	if count > wire.MaxList {
		return 0, fmt.Errorf("decode: list of %d extents exceeds the limit of %d: %w", count, wire.MaxList, api.ErrProtocol)
	}
	need := 9 + 16*int(count)
	if need > int(n) {
		return 0, fmt.Errorf("decode: %d extents need %d bytes, the body has %d: %w", count, need, n, api.ErrProtocol)
	}
	return need, nil
}

// readWritePrefix reads the fields in front of the payload from body, the
// n-byte body of a write, and returns them and the payload's length. What
// it refuses is an error that wraps api.ErrProtocol, unless body failed.
func readWritePrefix(body io.Reader, n uint32) (api.NodeAccess, int, error) {
	var m api.NodeAccess
	var head [8]byte
	if n < uint32(len(head)) {
		// Too short to hold a count: the decoder says what is missing.
		b := make([]byte, n)
		if _, err := io.ReadFull(body, b); err != nil {
			return m, 0, err
		}
		return m, 0, api.Decode(b, &m)
	}
	if _, err := io.ReadFull(body, head[:]); err != nil {
		return m, 0, err
	}
	need, err := writePrefixLen(head, n)
	if err != nil {
		return m, 0, err
	}
	prefix := make([]byte, need)
	copy(prefix, head[:])
	if _, err := io.ReadFull(body, prefix[len(head):]); err != nil {
		return m, 0, err
	}
	if err := api.Decode(prefix, &m); err != nil {
		return m, 0, err
	}
	return m, int(n) - need, nil
}

// checkWrite checks a write of n payload bytes into xs of d for c, and
// gives aliased frames among xs memory of their own (content.go).
func (c *conn) checkWrite(d *device, xs []api.Extent, n int) error {
	name := d.Info().Name
	if err := d.frames.checkWrite(c.owner, xs); err != nil {
		return fmt.Errorf("%s: write: %w", name, err)
	}
	if total := api.ExtentsLen(xs); total != uint64(n) {
		return fmt.Errorf("%s: write of %d bytes into extents of %d: %w", name, n, total, api.ErrInvalidArgument)
	}
	return c.node.content.own(c.share, d, xs)
}

// stickyReader remembers the first error of r other than io.EOF: after one,
// the connection is out of step.
type stickyReader struct {
	r   io.Reader
	err error
}

func (s *stickyReader) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// writeDirect executes the write whose header h was just read, reading its
// payload into device memory, and answers it. It returns an error only when
// the connection is broken.
func (c *conn) writeDirect(h wire.Header) error {
	body := &stickyReader{r: c.c.BodyReader(int(h.Len))}
	err := c.writeFrom(h, body)
	_, _ = io.Copy(io.Discard, body) // what a refused write left unread
	if body.err != nil {
		return fmt.Errorf("%v body: %w", h.Op, body.err)
	}
	if err == nil {
		err = c.c.Reply(h)
	}
	if !c.answer(h, err) {
		return fmt.Errorf("reply to %v: connection broken: %w", h.Op, net.ErrClosed)
	}
	return nil
}

// writeFrom reads, checks and executes a write from its body.
func (c *conn) writeFrom(h wire.Header, body io.Reader) error {
	m, n, err := readWritePrefix(body, h.Len)
	if err != nil {
		return fmt.Errorf("%v: %w", h.Op, err)
	}
	d, err := c.device(m.Device)
	if err != nil {
		return err
	}
	if err := c.checkWrite(d, m.Extents, n); err != nil {
		return err
	}
	return d.WriteFrom(m.Extents, body)
}
