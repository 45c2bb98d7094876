package api

import (
	"github.com/vgpu/vgpu/api/wire"
)

// The operations: the opcode of a request (wire.Op) says which message its
// body is. The numbers are part of the wire protocol, one space for every
// role, grouped here by role; a number, once used, keeps its meaning.

// Operations every peer understands.
const (
	OpHello   wire.Op = 1 // Hello → HelloReply; must be the first request
	OpKernels wire.Op = 2 // → KernelList
)

// Tenant operations: client → mediator. Addresses are tenant virtual addresses.
const (
	OpMalloc         wire.Op = 16 + iota // Malloc → MallocReply
	OpFree                               // Free
	OpStreamCreate                       // → StreamReply
	OpStreamDestroy                      // StreamReq
	OpCopyToDevice                       // CopyToDevice (+ payload)
	OpCopyFromDevice                     // CopyFromDevice → payload
	OpCopyDevice                         // CopyDevice
	OpMemset                             // Memset
	OpLaunch                             // Launch
	OpSynchronize                        // StreamReq; answered once all earlier commands completed
	OpStatus                             // → JSON Status
)

// Tenant operations of the data path (datapath.go).
const (
	OpHostRegister       wire.Op = 32 + iota // HostRegister, with a memfd passed alongside → HostRegion
	OpHostUnregister                         // HostRegion
	OpCopyToDeviceHost                       // CopyHost: from a registered host region
	OpCopyFromDeviceHost                     // CopyHost: into a registered host region
	OpBatch                                  // Batch; answered once every command in it completed
	OpSeal                                   // Seal
	OpGraphCreate                            // Batch (its stream unused) → Graph
	OpGraphLaunch                            // GraphLaunch
	OpGraphDestroy                           // Graph
	OpSessionStats                           // → SessionStats
	OpExport                                 // Export → Shared
	OpImport                                 // Shared → ImportReply
	OpRevoke                                 // Revoke
	OpPublish                                // At → BufVersion: the versioned buffer's draft becomes a version
	OpPin                                    // At → BufVersion: read the latest published version from now on
)

// Operator operations: vgpuctl and vgpu-hook → mediator. Those that change
// state need a peer running as root (or as the mediator's own user).
const (
	OpRegister wire.Op = 48 + iota // Register → RegisterReply; admission of a starting container
	OpRelease                      // Release; a stopped container's memory and socket are freed
	OpTenants                      // → JSON []TenantInfo
	OpReload                       // re-read the quota file; the old one stays if the new one is invalid
	// OpSelf → JSON SelfStatus: on a container's socket, what that
	// container has; the only status a container may read (self.go).
	OpSelf
)

// Node operations: mediator → node. Addresses are physical device addresses.
const (
	OpNodeAlloc      wire.Op = 64 + iota // NodeAlloc → NodeFrames
	OpNodeFree                           // NodeFrames
	OpNodeWrite                          // NodeAccess (+ payload)
	OpNodeRead                           // NodeAccess → payload
	OpNodeFill                           // NodeAccess
	OpNodeCopy                           // NodeCopy
	OpNodeLaunch                         // NodeLaunch
	OpNodeStatus                         // → JSON NodeStatus
	OpNodeBatch                          // Batch of node commands, in order, one reply
	OpNodeSeal                           // NodeFrames → NodeSealReply: make frames read-only and index their contents
	OpNodeDedup                          // NodeDedup → NodeDedupReply
	OpNodeExport                         // NodeExport → NodeObject
	OpNodeImport                         // NodeObject → NodeImportReply
	OpNodeRevoke                         // NodeRevoke
	OpNodeObjRead                        // NodeObjAccess → NodeGrant + bytes
	OpNodeObjWrite                       // NodeObjAccess (+ payload) → NodeGrant, once no other copy is valid
	OpNodeInval                          // NodeInval: pushed to a reader (wire.FlagPush); acknowledged with OpNodeInvalAck
	OpNodeInvalAck                       // NodeInval
	OpNodeRevoked                        // NodeRevoke: pushed to the revoked tenant's readers; acknowledged with OpNodeRevokedAck
	OpNodeRevokedAck                     // NodeRevoke
	OpNodeUnexport                       // NodeObject: its exporter ends it (frees the buffer)
	OpNodePublish                        // NodeObject → BufVersion
	OpNodePin                            // NodeObject → BufVersion: one more pin of the published version by the connection
	OpNodeUnpin                          // NodeVersion: undoes one pin of that version by the connection
	// OpNodeAttach: NodeAttach → NodeAttached. With Owner 0 the node keeps
	// the connection's frames for its reattach grace under Token when the
	// connection drops; with an Owner it hands the frames it kept of that
	// connection to this one (a restarted mediator's reclaim).
	OpNodeAttach
	OpNodeRestore // NodeRestore: a versioned object's published version, again, after the node restarted
)

// Tensor graphs (tensor.go): tenant → mediator.
const (
	OpGraphRegister wire.Op = 96 + iota // GraphDef → Graph
	OpGraphInvoke                       // GraphInvoke → the output tensors' bytes
	OpGraphRelease                      // Graph
)

// Tensor graphs: mediator → node.
const (
	OpNodeGraphRegister wire.Op = 112 + iota // NodeGraph → Graph
	OpNodeGraphRun                           // NodeGraphRun; answered once every launch completed
	OpNodeGraphFree                          // Graph
)

var opNames = map[wire.Op]string{
	OpHello: "hello", OpKernels: "kernels",
	OpMalloc: "malloc", OpFree: "free", OpStreamCreate: "stream-create", OpStreamDestroy: "stream-destroy",
	OpCopyToDevice: "copy-to-device", OpCopyFromDevice: "copy-from-device", OpCopyDevice: "copy-device",
	OpMemset: "memset", OpLaunch: "launch", OpSynchronize: "synchronize", OpStatus: "status",
	OpRegister: "register", OpRelease: "release", OpTenants: "tenants", OpReload: "reload", OpSelf: "self",
	OpNodeAlloc: "node-alloc", OpNodeFree: "node-free", OpNodeWrite: "node-write", OpNodeRead: "node-read",
	OpNodeFill: "node-fill", OpNodeCopy: "node-copy", OpNodeLaunch: "node-launch", OpNodeStatus: "node-status",
	OpHostRegister: "host-register", OpHostUnregister: "host-unregister",
	OpCopyToDeviceHost: "copy-to-device-host", OpCopyFromDeviceHost: "copy-from-device-host",
	OpBatch: "batch", OpSeal: "seal", OpGraphCreate: "graph-create", OpGraphLaunch: "graph-launch",
	OpGraphDestroy: "graph-destroy", OpSessionStats: "session-stats",
	OpNodeBatch: "node-batch", OpNodeSeal: "node-seal", OpNodeDedup: "node-dedup",
	OpExport: "export", OpImport: "import", OpRevoke: "revoke", OpPublish: "publish", OpPin: "pin",
	OpNodePublish: "node-publish", OpNodePin: "node-pin", OpNodeUnpin: "node-unpin", OpNodeAttach: "node-attach", OpNodeRestore: "node-restore",
	OpNodeExport: "node-export", OpNodeImport: "node-import", OpNodeRevoke: "node-revoke",
	OpNodeObjRead: "node-obj-read", OpNodeObjWrite: "node-obj-write", OpNodeInval: "node-inval", OpNodeInvalAck: "node-inval-ack",
	OpNodeRevoked: "node-revoked", OpNodeRevokedAck: "node-revoked-ack", OpNodeUnexport: "node-unexport",
	OpGraphRegister: "graph-register", OpGraphInvoke: "graph-invoke", OpGraphRelease: "graph-release",
	OpNodeGraphRegister: "node-graph-register", OpNodeGraphRun: "node-graph-run", OpNodeGraphFree: "node-graph-free",
}

// The wire's errors name operations by these names.
func init() { wire.NameOps(opNames) }
