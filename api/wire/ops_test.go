package wire

// Operations for the wire's tests. The wire knows no messages: these are
// numbers in frame headers, named (for the errors tests read) as the
// messages' package names them.
const (
	opHello          Op = 1
	opMalloc         Op = 16
	opFree           Op = 17
	opCopyToDevice   Op = 20
	opCopyFromDevice Op = 21
	opMemset         Op = 23
	opLaunch         Op = 24
	opSynchronize    Op = 25
	opStatus         Op = 26
	opHostRegister   Op = 32
	opNodeWrite      Op = 66
	opNodeRead       Op = 67
	opNodeFill       Op = 68
	opNodeLaunch     Op = 70
	opNodeStatus     Op = 71
)

func init() {
	NameOps(map[Op]string{
		opHello: "hello", opMalloc: "malloc", opFree: "free", opCopyToDevice: "copy-to-device",
		opCopyFromDevice: "copy-from-device", opMemset: "memset", opLaunch: "launch",
		opSynchronize: "synchronize", opStatus: "status", opHostRegister: "host-register",
		opNodeWrite: "node-write", opNodeRead: "node-read", opNodeFill: "node-fill",
		opNodeLaunch: "node-launch", opNodeStatus: "node-status",
	})
}
