// Package runtimehook attaches containers to the vGPU mediator through the
// OCI runtime: the logic of vgpu-runtime, the runtime-class wrapper around
// runc, and of vgpu-hook, the OCI hook it installs.
//
// It owns:
//   - the request interface: VGPU_MEMORY / VGPU_COMPUTE / VGPU_DEVICES in the
//     container's environment, or the annotations vgpu.io/memory,
//     vgpu.io/compute, vgpu.io/devices, which win (ParseRequest); a
//     Kubernetes pod's sandbox, which the CRI gives the pod's annotations
//     too, never asks;
//   - the wrapper's command line: its own --vgpu-* flags are taken out, runc's
//     are passed on unchanged and in order (ParseArgs);
//   - the runtime settings file (/etc/vgpu/runtime.toml): by the name the
//     wrapper is run as, its tenant, socket and state directory, which
//     containerd's runc.v2 options cannot pass as arguments (SettingsFile,
//     Resolve);
//   - the edits of config.json on create and run, each a small Modifier
//     composed in a Chain (SocketMount, SetEnv, AddHook, and SmiMount of
//     vgpu-smi read-only where the wrapper has one), and the bundle
//     rewrite (EditBundle); a restore (runc restore, which runs the bundle's
//     hooks too) of a container that asks for a vGPU is refused;
//   - the hook's typed command line (HookConfig) and its work on createRuntime
//     (register with the mediator) and poststop (release) (RunHook);
//   - a refused registration's reason shown first: the hook writes the
//     mediator's words as its first line (RefusedError), and the wrapper,
//     runc's parent on the create of a container it attached (RunCreate),
//     logs them as the error containerd and Docker show, runc's chain below;
//   - the container's socket directory on the host, StateDir/namespace/id
//     (SocketDir; "_" for no namespace). A container is named by its
//     containerd namespace (the base name of runc's --root) and its id
//     together: both hook stages pass both to the mediator, and both must be
//     plain names (vocab.ValidNamespace, vocab.ParseContainerID). The wrapper makes it, the
//     hook removes it (poststop, or a failed registration), neither
//     following a symlink out of StateDir (os.Root); the mediator only
//     opens its socket there.
//
// The OCI spec is translated once, at the edge, into our types (Request,
// HookConfig); everything past that works on those.
//
// Invariants:
//   - A container that asks for no vGPU is not touched: its config.json is
//     not rewritten, not even re-encoded (it stays byte-identical).
//   - The tenant comes from the operator only: the wrapper's --vgpu-tenant,
//     or the name it is run as, resolved through the runtime settings file
//     that vgpuctl install writes (Resolve, SettingsFile) or of the form
//     vgpu-runtime-<tenant>; else, for the plain vgpu-runtime, the
//     mediator's mapping of the containerd namespace. A name that resolves
//     to none of these never falls back to that mapping: the wrapper
//     refuses to create the container. A container may restate the
//     operator's tenant but never name another (ErrPermissionDenied).
//   - A malformed request stops the container from starting, with an error
//     that names the key and the value (ErrInvalidArgument).
//   - config.json is replaced atomically (temporary file in the bundle,
//     rename), keeping its mode; it is read whole, so one of more than
//     64 MiB is refused.
//
// Threat model. The container, its image and its annotations are hostile;
// the operator (runtime flags, the bundle's location, the state directory)
// and the runtime that calls us (runc, its state JSON on the hook's stdin)
// are trusted. The hook runs as root on the host, so, unlike the hooks
// behind CVE-2024-0132 and CVE-2025-23266, it:
//   - is a static Go binary (build it with CGO_ENABLED=0), so the dynamic
//     loader and LD_PRELOAD never come into play;
//   - runs with a fixed environment (HookEnv, set in the spec; runc would
//     otherwise pass its own), clears even that, and reads nothing
//     security-relevant from the environment;
//   - never executes anything from the container's root filesystem, and
//     resolves paths inside it without following symlinks out of it
//     (filepath-securejoin); a /run/vgpu in the image that is a symlink is
//     refused, and so is a spec mount above /run/vgpu (at /run or /,
//     directly or through the image's symlinks) other than a fresh tmpfs
//     (CheckMountPoint);
//   - always ends: runc kills it after HookTimeout seconds, and it gives up
//     on its own a little earlier (HookDeadline), with a message; the
//     mediator gives up waiting to register a container well before that,
//     so a registration does not outlive the hook that asked for it.
package runtimehook
