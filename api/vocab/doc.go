// Package vocab is the vocabulary every process of vgpu shares, beneath the
// wire protocol (api) and importing nothing of ours: error sentinels and
// their wire codes, tenant names and container ids with the one check of
// each, residency hints, shared-buffer modes, sizes, and default paths.
//
// Packages that need only these words (memory, isolation, coherence)
// import vocab, not the transport; api re-exports each under its old name,
// as the same value, for api's users.
//
// Invariants:
//   - Codes are part of the wire protocol: appended, never renumbered; each
//     has one sentinel, and CodeOf(fmt.Errorf("…: %w", sentinel)) is its code.
//   - A tenant name, a container id and a non-empty namespace are each
//     checked by one function (ParseTenant, ParseContainerID,
//     ValidNamespace), so that every process agrees on what it accepts; each
//     is one path component, never "." or "..".
package vocab
