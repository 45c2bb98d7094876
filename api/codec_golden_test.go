package api

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// The golden encodings of testdata/codec_golden.txt were captured from the
// hand-written codec this package had before the generated one
// (messages_gen.go) replaced it: each line is a message value's type, its
// wire bytes and the value the decoder gives back for them, printed with
// %#v so that a nil list and an empty one differ. The generated codec must
// reproduce both exactly — the Python client (python/vgpu/_wire.py) and
// peers of other builds read these bytes.
//
//	go test ./api -run TestCodecGolden -update   # only on a deliberate wire change

var updateGolden = flag.Bool("update", false, "rewrite testdata/codec_golden.txt from the current codec")

const goldenFile = "testdata/codec_golden.txt"

// goldenCases is samples() and the values it leaves out: every message
// type, optional trailing fields present and absent, each kind of a tagged
// argument, zero values, and limits.
func goldenCases() []Message {
	ext := []Extent{{Addr: 0x200000, Len: 4096}}
	cases := samples()
	cases = append(cases,
		&Hello{Magic: Magic, Version: Version, Role: RoleMediator, Tenant: "acme", Devices: 1, Weight: 3, ComputeMax: 0.25},
		&Hello{Magic: Magic, Version: Version, Role: RoleTenant, Tenant: "acme", Resumable: true},
		&Hello{Magic: Magic, Version: Version, Role: RoleTenant, Tenant: "acme", Resumable: true, Resume: strings.Repeat("k", MaxToken)},
		&HelloReply{Version: Version, Session: 7, Resumable: true, Token: "secret"},
		&HelloReply{},
		&Malloc{Device: 2, Size: 1 << 30, Hint: HintActivation, Flags: MallocFreeWithStream, Stream: 4},
		&Launch{Stream: 9, Kernel: "noargs"},
		&KernelList{},
		&KernelList{Kernels: []KernelInfo{{Name: "k", Params: []Param{
			{Name: "ids", Kind: ArgBuffer, Access: AccessRead, Elem: 4, Dims: []string{"b", "s"}, DType: DTypeI32},
			{Name: "none", Kind: ArgI64, Dims: []string{}},
		}}}},
		&NodeAttach{Owner: 12, Token: "tok"},
		&NodeAttach{Owner: 12, Token: "tok", HasGrace: true, GraceMillis: 10000},
		&NodeAttach{},
		&NodeAttached{Owner: 12, Devices: []NodeFrames{{Device: 0, Frames: []uint64{1 << 21}}, {Device: 3}}},
		&NodeAccess{Device: 1, Extents: ext, Value: 0},
		&NodeLaunch{Device: 2, Kernel: "k", Args: []NodeArg{{Kind: ArgBuffer}, {Kind: ArgI64, Bits: math.MaxUint64}, {Kind: 9, Bits: 1}}},
		&Register{Container: "c1", Namespace: "moby", Tenant: "acme", Memory: 1 << 30, Compute: 2, Devices: 1, Pid: 4242, SocketDir: "/run/vgpu/c/moby/c1"},
		&RegisterReply{Tenant: "acme", Memory: 1 << 30, Socket: "/run/vgpu/c/moby/c1/vgpu.sock"},
		&Release{Container: "c1", Namespace: "moby"},
		&Batch{},
		&Batch{Stream: 1, Cmds: []Cmd{{Op: OpFree}}},
		&NodeDedup{Device: 1, Hashes: [][32]byte{{}, {31: 0xff}}},
		&NodeRevoke{Object: 9, Tenant: "b", Seq: 77},
		&GraphDef{
			Name:    "mlp",
			Scalars: []string{"pos"},
			Tensors: []TensorDef{
				{Name: "w", DType: DTypeF32, Shape: []int64{64, 64}, Residency: ResWeight, Addr: 0x7f0000000000},
				{Name: "x", DType: DTypeF32, Shape: []int64{1, 64}, Residency: ResInput},
				{Name: "y", DType: DTypeI32, Shape: []int64{-1}, Residency: ResOutput},
			},
			Ops: []OpDef{
				{Kernel: "matmul", Phase: PhaseDecode, Args: []OpArg{
					{Kind: OpArgTensor, Tensor: 1}, {Kind: OpArgTensor, Tensor: 0}, {Kind: OpArgI64, I64: -64},
					{Kind: OpArgF32, F32: 1.5}, {Kind: OpArgScalar, Scalar: 0, Mul: 64, I64: 3},
				}},
				{Kernel: "relu", Phase: PhaseOther},
			},
		},
		&GraphDef{},
		&GraphInvoke{Graph: 3, Scalars: []int64{5, -1}, Inputs: []byte{1, 2, 3, 4}},
		&GraphInvoke{Graph: 3},
		&NodeGraph{Device: 1, Launches: []NodeGraphLaunch{
			{Kernel: "matmul", Phase: PhasePrefill, Args: []NodeGraphArg{
				{NodeArg: NodeArg{Kind: ArgBuffer, Extents: ext}, Scalar: -1},
				{NodeArg: NodeArg{Kind: ArgI64, Bits: 64}, Scalar: -1},
				{NodeArg: NodeArg{Kind: ArgI64}, Scalar: 0, Mul: 64, Add: -2},
				{NodeArg: NodeArg{Kind: ArgF32, Bits: F32Bits(0.5)}, Scalar: -1},
			}},
			{Kernel: "empty", Phase: PhaseBackward},
		}},
		&NodeGraph{},
		&NodeGraphRun{Graph: 4, Scalars: []int64{1, 2, 3}},
		&NodeGraphRun{},
		&NodeSealReply{},
	)
	for _, name := range messageNames() {
		cases = append(cases, messages[name].new())
	}
	return cases
}

func goldenLine(m Message) (string, error) {
	b := Encode(m)
	got := reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message)
	if err := Decode(b, got); err != nil {
		return "", fmt.Errorf("%T: decode of its own encoding: %w", m, err)
	}
	return fmt.Sprintf("%s %x %#v", reflect.TypeOf(m).Elem().Name(), b, got), nil
}

// TestCodecGolden: every message encodes to the captured bytes and decodes
// from them to the captured value; every message type has a case.
func TestCodecGolden(t *testing.T) {
	var lines []string
	types := map[string]bool{}
	for _, m := range goldenCases() {
		l, err := goldenLine(m)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
		types[reflect.TypeOf(m).Elem().Name()] = true
	}
	for _, name := range messageNames() {
		if !types[name] {
			t.Errorf("message type %s has no golden case", name)
		}
	}
	if *updateGolden {
		if err := os.WriteFile(goldenFile, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var want []string
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(lines) {
		t.Fatalf("%s has %d cases, the test %d", goldenFile, len(want), len(lines))
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("case %d:\n got  %s\n want %s", i, lines[i], w)
			continue
		}
		// The captured bytes, decoded afresh: the decoder reads them, not
		// only what this build's encoder wrote.
		name, rest, _ := strings.Cut(w, " ")
		hx, _, _ := strings.Cut(rest, " ")
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		m := messages[name].new()
		if err := Decode(b, m); err != nil {
			t.Errorf("case %d (%s): %v", i, name, err)
		} else if !bytes.Equal(Encode(m), b) {
			t.Errorf("case %d (%s): re-encodes differently", i, name)
		}
	}
}
