package mediator_test

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
	"github.com/vgpu/vgpu/memory"
)

// Charging sealed weights that the node stores once (dedup_charge).

const frame = memory.FrameSize

// startQuota is a mediator with the quota file quota in front of one sim
// node with one device of 256 MiB.
func startQuota(t *testing.T, quota string) *containerSystem {
	t.Helper()
	path := filepath.Join(t.TempDir(), "q.toml")
	if err := os.WriteFile(path, []byte(quota), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startWith(t, 256<<20, func(c *mediator.Config) { c.Quota = path })
	return &containerSystem{system: s, dir: filepath.Join(s.dir, "c"), quota: path}
}

// register admits container id of tenant with memory bytes and dials its
// socket.
func (cs *containerSystem) register(t *testing.T, op *client.Operator, id, tenant string, memory uint64) *client.Client {
	t.Helper()
	r, err := op.Register(api.Register{Container: id, Tenant: tenant, Memory: memory})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(client.Options{Socket: r.Socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// uploadSealed uploads data into a new weight buffer of c, seals it and
// returns it with the pieces the node filled from sealed frames.
func uploadSealed(t *testing.T, c *client.Client, data []byte) (client.Ptr, uint64) {
	t.Helper()
	before, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	w, _ := upload(t, c, data)
	if err := c.Seal(w); err != nil {
		t.Fatal(err)
	}
	after, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return w, after.DedupHits - before.DedupHits
}

// wantCharged checks what the tenant's budgets hold and its sessions
// allocated.
func wantCharged(t *testing.T, op *client.Operator, tenant string, charged, allocated uint64) {
	t.Helper()
	if ti := tenantInfo(t, op, tenant); ti.Charged != charged || ti.Allocated != allocated {
		t.Fatalf("tenant %s: charged %d bytes, allocated %d; want %d and %d", tenant, ti.Charged, ti.Allocated, charged, allocated)
	}
}

const chargeQuota = `
[tenants.origin]
dedup_charge = 0
[tenants.free]
dedup_charge = 0
[tenants.half]
dedup_charge = 0.5
[tenants.full]
`

// TestDedupChargeCreditsSealedWeights: tenants load weights that another
// tenant sealed first. The node stores them once; after the seal, a tenant
// with dedup_charge 0 is charged nothing for them and may allocate the
// space they would otherwise take, one with 0.5 half of it, one with the
// default (1) the whole, so the same allocation fails for it with quota
// exceeded. Limits stay exact: an allocation that ends at the limit
// succeeds, one byte more fails. Malloc charges in full; the credit comes
// with the seal. The tenant whose copy is shared, and another container of
// that tenant, get no credit. Frees return exactly what is charged.
func TestDedupChargeCreditsSealedWeights(t *testing.T) {
	cs := startQuota(t, chargeQuota)
	op := cs.operator(t)
	const grant = 12 << 20
	weights := randomBytes(42, 4*frame) // 8 MiB: four frames

	origin := cs.register(t, op, "origin-1", "origin", grant)
	if _, hits := uploadSealed(t, origin, weights); hits != 0 {
		t.Fatalf("first upload: %d pieces deduplicated", hits)
	}
	wantCharged(t, op, "origin", 4*frame, 4*frame)
	// A second container of the same tenant shares the frames but earns
	// nothing: only content another tenant sealed is credited.
	again := cs.register(t, op, "origin-2", "origin", grant)
	if _, hits := uploadSealed(t, again, weights); hits != 4 {
		t.Fatalf("upload by the same tenant: %d pieces deduplicated, want 4", hits)
	}
	wantCharged(t, op, "origin", 8*frame, 8*frame)

	for _, tc := range []struct {
		tenant string
		charge float64
		credit uint64 // for the four frames
	}{
		{"free", 0, 4 * frame},
		{"half", 0.5, 2 * frame},
		{"full", 1, 0},
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			id := "ctr-" + tc.tenant
			c := cs.register(t, op, id, tc.tenant, grant)
			if got := tenantInfo(t, op, tc.tenant).DedupCharge; got != tc.charge {
				t.Fatalf("dedup_charge listed as %v, want %v", got, tc.charge)
			}
			w, _ := upload(t, c, weights)
			// Unsealed, the weights are charged in full.
			wantCharged(t, op, tc.tenant, 4*frame, 4*frame)
			_, err := c.Malloc(0, grant-4*frame+1)
			wantErr(t, err, api.ErrQuotaExceeded, id)
			if err := c.Seal(w); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Stats(); err != nil || st.DedupHits != 4 {
				t.Fatalf("%d pieces deduplicated (%v), want 4", st.DedupHits, err)
			}
			charged := 4*frame - tc.credit
			wantCharged(t, op, tc.tenant, charged, 4*frame)

			// The space the weights take: free for "free", ending exactly
			// at the limit for "half", over it for "full".
			var held []client.Ptr
			p, err := c.Malloc(0, 4*frame)
			if tc.credit < 2*frame {
				wantErr(t, err, api.ErrQuotaExceeded, id, fmt.Sprint(grant))
			} else {
				if err != nil {
					t.Fatalf("allocation of the weights' size after the seal: %v", err)
				}
				held, charged = append(held, p), charged+4*frame
			}
			// What is left, exactly.
			if room := grant - charged; room > 0 {
				_, err = c.Malloc(0, room+1)
				wantErr(t, err, api.ErrQuotaExceeded, id)
				p, err := c.Malloc(0, room)
				if err != nil {
					t.Fatalf("allocation of the %d bytes left: %v", room, err)
				}
				held = append(held, p)
			}
			_, err = c.Malloc(0, 1)
			wantErr(t, err, api.ErrQuotaExceeded, id)
			wantCharged(t, op, tc.tenant, grant, 4*frame+grant-(4*frame-tc.credit))

			// Frees return what was charged, the weights less their credit.
			if err := c.Free(w); err != nil {
				t.Fatal(err)
			}
			wantCharged(t, op, tc.tenant, grant-(4*frame-tc.credit), grant-(4*frame-tc.credit))
			for _, p := range held {
				if err := c.Free(p); err != nil {
					t.Fatal(err)
				}
			}
			wantCharged(t, op, tc.tenant, 0, 0)
			// The container's budget takes the full weights again after a
			// session end returns a credited allocation.
			c2, err := client.Dial(client.Options{Socket: filepath.Join(cs.dir, vocab.NoNamespace, id, mediator.SocketName)})
			if err != nil {
				t.Fatal(err)
			}
			uploadSealed(t, c2, weights)
			wantCharged(t, op, tc.tenant, 4*frame-tc.credit, 4*frame)
			c2.Close()
			cs.waitSessionGone(t, c2.Session())
			wantCharged(t, op, tc.tenant, 0, 0)
			if err := op.Release("", id); err != nil {
				t.Fatal(err)
			}
		})
	}
	if st := cs.nodes[0].ContentStats(); st.Aliased != 4 {
		t.Errorf("node: %d frames aliased with origin-2's copy alone left, want 4 (%+v)", st.Aliased, st)
	}
	wantCharged(t, op, "origin", 8*frame, 8*frame)
}

const driftQuota = `
[tenants.zero]
dedup_charge = 0
[tenants.half]
dedup_charge = 0.5
[tenants.odd]
dedup_charge = 0.3
[tenants.full]
`

// TestDedupChargeNeverDrifts drives random uploads of weights (of a few
// shared contents, and unique ones), seals, frees and disconnects of two
// sessions in each of four containers whose tenants have different
// dedup_charge, against a model of the node's content index and aliases.
// An allocation succeeds exactly when the budget the model predicts has
// room; each tenant's budget always holds the sum over its live
// allocations of footprint − credit, where a sealed frame earns credit
// exactly when it maps another tenant's sealed frame; and everything
// returns to 0 when the sessions end.
func TestDedupChargeNeverDrifts(t *testing.T) {
	cs := startQuota(t, driftQuota)
	// Runs share the node, which retains each run's sealed frames. A bound
	// that one run's (62 at most: two shared contents, 60 unique frames)
	// never reach gives up earlier runs' instead, the least recently used,
	// so the device never fills and no allocation reclaims a frame the
	// model holds.
	cs.nodes[0].LimitRetention(64 * frame)
	op := cs.operator(t)
	const grant = 10 << 20
	tenants := []struct {
		name   string
		credit uint64 // per frame: (1 − dedup_charge) of it, rounded down
	}{{"zero", frame}, {"half", frame / 2}, {"odd", 1468006}, {"full", 0}}
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		// Contents of this run's own: the node retains sealed frames of
		// earlier runs.
		shared := [][]byte{randomBytes(uint64(2*run), frame), randomBytes(uint64(2*run+1), frame)}
		// The model of the node: frames by their content, in the order
		// the node's index keeps them.
		type mframe struct {
			content int
			tenant  string // "" once the node retains it
			sealed  bool
			aliasOf *mframe // the frame whose memory it maps
		}
		type malloc struct {
			p      client.Ptr
			frames []*mframe
			credit uint64
		}
		index := map[int][]*mframe{}
		var all []*mframe
		// forget frees frames, named in one request: the node retains a
		// sealed frame with memory of its own and no other indexed frame
		// of its content but its aliases, which keep mapping it, taking
		// those of one content in the reverse of their order in the index;
		// it scrubs the others, their aliases given copies.
		forget := func(frames []*mframe) {
			pos := func(f *mframe) int {
				if !f.sealed {
					return -1
				}
				return slices.Index(index[f.content], f)
			}
			frames = slices.Clone(frames)
			slices.SortStableFunc(frames, func(a, b *mframe) int { return cmp.Compare(pos(b), pos(a)) })
			for _, f := range frames {
				all = slices.DeleteFunc(all, func(g *mframe) bool { return g == f })
				if f.sealed && f.aliasOf == nil && !slices.ContainsFunc(index[f.content], func(g *mframe) bool { return g != f && g.aliasOf != f }) {
					f.tenant = ""
					continue
				}
				for _, g := range all {
					if g.aliasOf == f {
						g.aliasOf = nil
					}
				}
				f.aliasOf = nil
				if f.sealed {
					index[f.content] = slices.DeleteFunc(index[f.content], func(g *mframe) bool { return g == f })
				}
			}
		}
		type session struct {
			c      *client.Client
			host   []byte
			allocs []*malloc
		}
		sessions := make([][2]*session, len(tenants))
		charged := func(k int) (c, a uint64) {
			for _, s := range sessions[k] {
				if s == nil {
					continue
				}
				for _, m := range s.allocs {
					c += uint64(len(m.frames))*frame - m.credit
					a += uint64(len(m.frames)) * frame
				}
			}
			return c, a
		}
		for _, tn := range tenants {
			id := fmt.Sprintf("drift%d-%s", run, tn.name)
			if _, err := op.Register(api.Register{Container: id, Tenant: tn.name, Memory: grant}); err != nil {
				rt.Fatal(err)
			}
			defer op.Release("", id)
		}
		unique := 100
		for step := range rapid.IntRange(5, 30).Draw(rt, "steps") {
			// Tenants take turns unless drawn otherwise, so that contents
			// one sealed are often loaded by another.
			k := (step + rapid.IntRange(0, len(tenants)-1).Draw(rt, "tenant")) % len(tenants)
			tn := tenants[k]
			i := rapid.IntRange(0, 1).Draw(rt, "session")
			s := sessions[k][i]
			if s == nil {
				sock := filepath.Join(cs.dir, vocab.NoNamespace, fmt.Sprintf("drift%d-%s", run, tn.name), mediator.SocketName)
				c, err := client.Dial(client.Options{Socket: sock})
				if err != nil {
					rt.Fatalf("step %d: dial: %v", step, err)
				}
				host, err := c.HostAlloc(2 * frame)
				if err != nil {
					rt.Fatalf("step %d: host memory: %v", step, err)
				}
				s = &session{c: c, host: host}
				sessions[k][i] = s
			}
			seal := func(a *malloc) {
				if err := s.c.Seal(a.p); err != nil {
					rt.Fatalf("step %d: seal: %v", step, err)
				}
				for _, f := range a.frames {
					f.sealed = true
					index[f.content] = append(index[f.content], f)
					if f.aliasOf != nil && f.aliasOf.tenant != "" && f.aliasOf.tenant != tn.name {
						a.credit += tn.credit
					}
				}
			}
			switch kind := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case kind < 6: // upload weights, and seal them at once or not
				n := rapid.IntRange(1, 2).Draw(rt, "frames")
				a := &malloc{}
				for j := range n {
					// Mostly the shared contents, sometimes one of its own.
					f := &mframe{content: rapid.IntRange(0, 2*len(shared)).Draw(rt, "content") / 2, tenant: tn.name}
					if f.content == len(shared) {
						f.content = unique
						unique++
						copy(s.host[j*frame:], shared[0])
						binary.LittleEndian.PutUint64(s.host[j*frame:], uint64(f.content))
					} else {
						copy(s.host[j*frame:], shared[f.content])
					}
					a.frames = append(a.frames, f)
				}
				size := uint64(n) * frame
				used, _ := charged(k)
				p, err := s.c.MallocWith(0, size, client.AllocOptions{Hint: api.HintWeight})
				fits := used+size <= grant
				switch {
				case fits && err != nil:
					rt.Fatalf("step %d: %s: %d bytes with %d of %d charged: %v", step, tn.name, size, used, grant, err)
				case !fits && !errors.Is(err, api.ErrQuotaExceeded):
					rt.Fatalf("step %d: %s: %d bytes with %d of %d charged: %v, want quota exceeded", step, tn.name, size, used, grant, err)
				case err != nil:
					continue
				}
				a.p = p
				st := s.c.Stream()
				st.CopyToDevice(p, s.host[:size])
				if err := st.Synchronize(); err != nil {
					rt.Fatalf("step %d: upload: %v", step, err)
				}
				for _, f := range a.frames {
					// The memory of the first frame of the content whose
					// memory a tenant holds, else of the first.
					root := func(g *mframe) *mframe {
						if g.aliasOf != nil {
							return g.aliasOf
						}
						return g
					}
					if refs := index[f.content]; len(refs) > 0 {
						f.aliasOf = root(refs[max(0, slices.IndexFunc(refs, func(g *mframe) bool { return root(g).tenant != "" }))])
					}
				}
				all = append(all, a.frames...)
				s.allocs = append(s.allocs, a)
				if kind < 4 {
					seal(a)
				}
			case kind < 7: // seal one not sealed yet
				var open []*malloc
				for _, a := range s.allocs {
					if !a.frames[0].sealed {
						open = append(open, a)
					}
				}
				if len(open) == 0 {
					continue
				}
				seal(open[rapid.IntRange(0, len(open)-1).Draw(rt, "which")])
			case kind < 9: // free one
				if len(s.allocs) == 0 {
					continue
				}
				j := rapid.IntRange(0, len(s.allocs)-1).Draw(rt, "which")
				if err := s.c.Free(s.allocs[j].p); err != nil {
					rt.Fatalf("step %d: free: %v", step, err)
				}
				forget(s.allocs[j].frames)
				s.allocs = slices.Delete(s.allocs, j, j+1)
			default: // disconnect: everything of the session goes
				id := s.c.Session()
				s.c.Close()
				var all []*mframe // returned together, as the session ends
				for _, a := range s.allocs {
					all = append(all, a.frames...)
				}
				forget(all)
				sessions[k][i] = nil
				cs.waitSessionGone(t, id)
			}
			c, a := charged(k)
			if ti := tenantInfo(t, op, tn.name); ti.Charged != c || ti.Allocated != a {
				rt.Fatalf("step %d: tenant %s: charged %d bytes, allocated %d; the model says %d and %d", step, tn.name, ti.Charged, ti.Allocated, c, a)
			}
		}
		for k := range sessions {
			for i, s := range sessions[k] {
				if s != nil {
					s.c.Close()
					cs.waitSessionGone(t, s.c.Session())
					sessions[k][i] = nil
				}
			}
		}
		for _, tn := range tenants {
			if ti := tenantInfo(t, op, tn.name); ti.Charged != 0 || ti.Allocated != 0 {
				rt.Fatalf("all sessions ended: tenant %s still charged %d bytes, allocated %d", tn.name, ti.Charged, ti.Allocated)
			}
		}
	})
}

// waitSessionGone waits until the mediator has torn session id down.
func (cs *containerSystem) waitSessionGone(t *testing.T, id uint64) {
	t.Helper()
	for range 500 {
		if !slices.ContainsFunc(cs.med.Status().Tenants, func(ts api.TenantStatus) bool { return ts.Session == id }) {
			return
		}
		sleepBriefly()
	}
	t.Fatalf("session %d still open", id)
}
