package client

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

func TestDialNamesBadEnvironment(t *testing.T) {
	for _, v := range []string{"two", "2x", "1.9", "3 devices", "0", "-1", "4294967296"} {
		t.Setenv("VGPU_DEVICES", v)
		_, err := Dial(Options{Socket: filepath.Join(t.TempDir(), "none")})
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), strconv.Quote(v)) {
			t.Errorf("VGPU_DEVICES=%s: %v", v, err)
		}
	}
	_, err := Dial(Options{Socket: filepath.Join(t.TempDir(), "none"), Devices: -1})
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "-1") {
		t.Errorf("Devices -1: %v", err)
	}
}

func TestDialWithoutMediatorIsUnavailable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	t.Setenv("VGPU_SOCKET", sock)
	_, err := Dial(Options{})
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), sock) {
		t.Fatalf("dial %s: %v", sock, err)
	}
	if _, err := DialOperator(sock); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("operator dial %s: %v", sock, err)
	}
}

func TestConversionsRoundTrip(t *testing.T) {
	fs := []float32{0, 1, -2.5, math.MaxFloat32, float32(math.Inf(-1)), math.SmallestNonzeroFloat32}
	if got := BytesFloat32(Float32Bytes(fs)); !slices.Equal(got, fs) {
		t.Fatalf("float round trip: %v", got)
	}
	if got := BytesFloat32(append(Float32Bytes(fs), 1, 2)); len(got) != len(fs) {
		t.Fatalf("a trailing partial float was decoded: %d values", len(got))
	}
	b := Int32Bytes([]int32{1, -1})
	if !slices.Equal(b, []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}) {
		t.Fatalf("int32 encoding %v", b)
	}
	if p := Ptr(0x1000).Add(0x20); p != 0x1020 {
		t.Fatalf("Ptr.Add = %#x", uint64(p))
	}
}
