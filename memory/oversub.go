package memory

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vgpu/vgpu/api/vocab"
)

// Oversubscribe makes the space oversubscribe: its allocations may exceed
// the device memory it holds, up to its limit, with the contents of evicted
// chunks kept in store. resident caps the bytes of frames the space holds
// (rounded down to whole frames, at least one); 0 leaves only the devices'
// own out-of-memory to limit them. The space's limit still caps its
// allocations, and should be set: without one, only the address space
// bounds what a tenant may allocate (and what the store may have to hold).
// Call it once, before the first Alloc; without it the space never evicts
// and never calls Read, Write or Zero of its source. It panics if store is
// nil or the space is already in use.
func (s *Space) Oversubscribe(store Store, resident uint64) {
	if store == nil {
		panic("memory: Oversubscribe with a nil store")
	}
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store != nil || len(s.chunks) > 0 || s.closed {
		panic("memory: Oversubscribe on a space already in use")
	}
	s.store = store
	s.lend, _ = store.(frameStore)
	if resident != 0 {
		s.maxFrames = int(max(1, resident/FrameSize))
	}
}

// planFrame is the frame a fault-in puts a chunk in: one granted for it,
// which reads as zero, or one reused from a victim, which does not.
type planFrame struct {
	frame  uint64
	reused bool
}

// faultPlan is what faultIn does, worked out as it goes.
type faultPlan struct {
	need    []*chunk    // evicted chunks to fault in, by device, then address
	frames  []planFrame // need[i] goes to frames[i]
	victims []*chunk    // resident chunks to evict, whose frames need reuses
	keys    []uint64    // the store keys of victims saved so far
	granted []devFrame  // frames granted for the fault-in
}

// faultIn makes every chunk of the valid ranges rs resident. The caller
// holds allocMu.
//
// It first plans: which resident chunks outside the ranges to evict, in
// the order of colder, to stay within the cap, and which frames the evicted
// chunks go to: victims' frames of the same device, then fresh grants, then
// the frames of more victims of the device if it is full. A victim's frame
// that no chunk reuses, or that the source sealed, goes back to the source
// before the grants, so that they find the room it leaves (a container's
// resident memory, a full device): such victims are evicted at once, and
// stay evicted whatever follows. Then it saves the contents of the victims
// whose frames are reused to the store, but for clean ones, whose entries
// it kept. Up to here a failure undoes the rest: grants are returned, saved
// entries dropped. Then it commits: unmaps those victims, fills each frame
// (the stored contents, or zeros for a reused frame) and maps the chunk,
// keeping the entry of a chunk whose allocations are all sealed. A source
// or store failure while filling leaves the victims evicted and the chunks
// not yet filled evicted, with their contents intact, returns the frames
// left over and reports the error.
func (s *Space) faultIn(rs []Range) error {
	s.pinEpoch++
	p := &faultPlan{}
	chunks := 0 // distinct chunks in rs
	var total uint64
	for _, r := range rs {
		total += r.Len
		for cva := r.VA &^ (Page2M - 1); cva < r.VA+r.Len; cva += Page2M {
			c := s.chunks[cva]
			if c.pin == s.pinEpoch {
				continue
			}
			c.pin = s.pinEpoch
			chunks++
			if !c.resident {
				p.need = append(p.need, c)
			}
		}
	}
	if len(p.need) == 0 {
		return nil
	}
	if s.maxFrames != 0 && chunks > s.maxFrames {
		return fmt.Errorf("%d bytes span %d chunks of %d bytes, but the space may keep only %d bytes resident: %w",
			total, chunks, Page2M, uint64(s.maxFrames)*FrameSize, vocab.ErrOutOfMemory)
	}
	slices.SortFunc(p.need, func(a, b *chunk) int { return cmp.Or(cmp.Compare(a.dev, b.dev), cmp.Compare(a.va, b.va)) })
	if err := s.plan(p); err != nil {
		return s.undo(p, err)
	}
	for _, v := range p.victims {
		key, err := s.save(v)
		if err != nil {
			return s.undo(p, err)
		}
		p.keys = append(p.keys, key)
	}

	for i, v := range p.victims {
		s.toldEvicted(v, p.keys[i])
	}
	s.mu.Lock()
	for i, v := range p.victims {
		s.evictLocked(v, p.keys[i])
	}
	s.mu.Unlock()
	refilled, refillErr := s.refill(p)
	for i, c := range p.need {
		f := p.frames[i]
		var err error
		if !refilled[i] {
			if err = s.load(c, f); err != nil {
				err = errors.Join(err, refillErr[c.dev]) // the refill's own error, if it failed too
			}
		}
		if err != nil {
			var left []devFrame
			for j, f := range p.frames[i:] {
				left = append(left, devFrame{p.need[i+j].dev, f.frame})
			}
			for _, f := range left {
				delete(s.held, f) // granted frames were recorded as held
			}
			return errors.Join(err, s.returnFrames("after a failed fault-in", left))
		}
		s.mu.Lock()
		c.frame, c.resident = f.frame, true
		s.evicted--
		s.addResident(c)
		s.mapChunk(c)
		c.lru = s.tick
		s.faults++
		if refilled[i] {
			s.refills++
		}
		s.mu.Unlock()
		s.toldResident(c)
		if c.stored && c.unsealed > 0 { // it may change: its entry would go stale
			s.dropKey(c)
		}
	}
	return nil
}

// plan chooses the frames for p.need and the victims that free them, and
// evicts at once the victims whose frames go back to the source.
func (s *Space) plan(p *faultPlan) error {
	want := make(map[uint32]int) // chunks to fault in, per device
	for _, c := range p.need {
		want[c.dev]++
	}
	s.mu.Lock() // for chunk.lru and chunk.frameSealed
	victims, err := s.capVictims(p, want)
	reuse := make(map[uint32][]*chunk)
	var back []*chunk
	for _, v := range victims {
		if !v.frameSealed && len(reuse[v.dev]) < want[v.dev] {
			reuse[v.dev] = append(reuse[v.dev], v)
		} else {
			back = append(back, v)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.evictNow(back); err != nil {
		return err
	}
	p.frames = make([]planFrame, len(p.need))
	for first := 0; first < len(p.need); {
		dev := p.need[first].dev
		last := first + want[dev]
		i := first
		reuseFrame := func(v *chunk) {
			p.victims = append(p.victims, v)
			p.frames[i] = planFrame{frame: v.frame, reused: true}
			i++
		}
		// grant asks for up to k frames for the chunks from i on; short is
		// why it got fewer.
		grant := func(k int) (short, err error) {
			if k == 0 {
				return nil, nil
			}
			frames, short, err := s.grantSome(dev, k)
			for _, f := range frames {
				p.granted = append(p.granted, devFrame{dev, f})
				p.frames[i] = planFrame{frame: f}
				i++
			}
			return short, err
		}
		for _, v := range reuse[dev] {
			reuseFrame(v)
		}
		reused := i - first
		short, err := grant(last - i)
		if err != nil {
			return err
		}
		if missing := last - i; missing > 0 { // the device is full: evict to make room
			s.mu.Lock()
			more := s.coldest(s.resident[dev], missing, lastRank)
			var sealed []*chunk
			if len(more) == missing {
				for _, v := range more {
					if v.frameSealed {
						sealed = append(sealed, v)
					} else {
						reuseFrame(v)
					}
				}
			}
			s.mu.Unlock()
			if len(more) < missing {
				return fmt.Errorf("device %d: %d frames wanted for chunks to fault in, %d granted (%v), and only %d resident chunks of the device outside the range may be evicted: %w",
					dev, want[dev], want[dev]-reused-missing, short, reused+len(more), vocab.ErrOutOfMemory)
			}
			// A sealed frame cannot be refilled: return it and ask again.
			if err := s.evictNow(sealed); err != nil {
				return err
			}
			if short, err := grant(len(sealed)); err != nil {
				return err
			} else if i < last {
				return fmt.Errorf("device %d: %d frames wanted for chunks to fault in, %d still missing after returning %d sealed frames of evicted chunks (%v): %w",
					dev, want[dev], last-i, len(sealed), short, vocab.ErrOutOfMemory)
			}
		}
		first = last
	}
	return nil
}

// capVictims picks the resident chunks to evict to stay within the cap,
// class by class, evicting chunks of the devices that need frames first
// within a class, since their frames can be reused as they are. The caller
// holds mu and allocMu.
func (s *Space) capVictims(p *faultPlan, want map[uint32]int) ([]*chunk, error) {
	if s.maxFrames == 0 {
		return nil, nil
	}
	excess := s.frames + len(p.need) - s.maxFrames
	all := s.residentChunks()
	devs := slices.Sorted(maps.Keys(want))
	taken := make(map[uint32]int) // victims per device
	var victims []*chunk
	pick := func(list []*chunk, k, rank int) {
		for _, v := range s.coldest(list, k, rank) {
			taken[v.dev]++
			victims = append(victims, v)
		}
	}
	for rank := 0; rank <= lastRank && len(victims) < excess; rank++ {
		for _, dev := range devs {
			pick(s.resident[dev], min(excess-len(victims), want[dev]-taken[dev]), rank)
		}
		pick(all, excess-len(victims), rank)
	}
	if len(victims) < excess { // cannot happen: the ranges fit the cap
		return nil, fmt.Errorf("%d chunks to fault in, only %d of %d resident chunks may be evicted: %w",
			len(p.need), len(victims), s.frames, vocab.ErrOutOfMemory)
	}
	return victims, nil
}

// evictNow evicts the resident chunks vs and returns their frames. On
// failure, those evicted before it stay evicted.
func (s *Space) evictNow(vs []*chunk) error {
	var freed []devFrame
	var err error
	for _, v := range vs {
		var key uint64
		if key, err = s.save(v); err != nil {
			break
		}
		s.toldEvicted(v, key)
		s.mu.Lock()
		s.evictLocked(v, key)
		s.mu.Unlock()
		freed = append(freed, devFrame{v.dev, v.frame})
	}
	return errors.Join(err, s.returnFrames("of evicted chunks", freed))
}

// evictRank is the eviction class of each hint: lower ranks are evicted
// first. Ephemeral buffers are the cheapest to bring back or lose, weights
// (read by every step) the costliest.
var evictRank = [...]int{
	vocab.HintActivation: 0,
	vocab.HintStaging:    0,
	vocab.HintNone:       1,
	vocab.HintKVCache:    2,
	vocab.HintWeight:     3,
}

const lastRank = 3

// colder orders chunks for eviction: by class, then least recently
// translated, then by address.
func colder(a, b *chunk) int {
	return cmp.Or(cmp.Compare(evictRank[a.hint], evictRank[b.hint]), cmp.Compare(a.lru, b.lru), cmp.Compare(a.va, b.va))
}

// residentChunks returns every resident chunk, by device. The caller holds
// allocMu.
func (s *Space) residentChunks() []*chunk {
	var all []*chunk
	for _, dev := range slices.Sorted(maps.Keys(s.resident)) {
		all = append(all, s.resident[dev]...)
	}
	return all
}

// coldest picks up to k chunks of list of rank at most maxRank, first in
// the order of colder, that are neither pinned by the current fault-in nor
// picked already, and marks them picked. The caller holds mu and allocMu.
func (s *Space) coldest(list []*chunk, k, maxRank int) []*chunk {
	var cand []*chunk
	for _, c := range list {
		if c.pin != s.pinEpoch && evictRank[c.hint] <= maxRank {
			cand = append(cand, c)
		}
	}
	switch {
	case k <= 0:
		cand = nil
	case k == 1 && len(cand) > 1:
		cand = []*chunk{slices.MinFunc(cand, colder)}
	case k < len(cand):
		slices.SortFunc(cand, colder)
		cand = cand[:k]
	}
	for _, c := range cand {
		c.pin = s.pinEpoch
	}
	return cand
}

// grantSome grants up to n frames of dev, recording them as held: all at
// once if it can, else one at a time until the device is full. It fails
// only for errors other than out-of-memory, returning what it got so far;
// short is the out-of-memory error that stopped it short of n, if any.
func (s *Space) grantSome(dev uint32, n int) (frames []uint64, short, err error) {
	frames, err = s.grant(dev, n)
	if errors.Is(err, vocab.ErrOutOfMemory) && n > 1 {
		frames, err = nil, nil
		for len(frames) < n {
			f, ferr := s.grant(dev, 1)
			if ferr != nil {
				err = ferr
				break
			}
			frames = append(frames, f[0])
			s.held[devFrame{dev, f[0]}] = true // so that a repeat is refused
		}
	}
	for _, f := range frames {
		s.held[devFrame{dev, f}] = true
	}
	if errors.Is(err, vocab.ErrOutOfMemory) {
		short, err = err, nil
	}
	return frames, short, err
}

// undo reverses a fault-in plan that has not committed: it drops the
// entries saved for victims (not those clean ones kept) and returns the
// granted frames. It returns err, with any failure to return frames.
func (s *Space) undo(p *faultPlan, err error) error {
	for i, k := range p.keys {
		if !p.victims[i].stored {
			s.store.Drop(k)
		}
	}
	for _, f := range p.granted {
		delete(s.held, f)
	}
	return errors.Join(err, s.returnFrames("granted for a failed fault-in", p.granted))
}

// returnFrames gives frames back to the source, one call per device. As in
// Free, frames whose Return fails are forgotten.
func (s *Space) returnFrames(what string, fs []devFrame) error {
	byDev := make(map[uint32][]uint64)
	for _, f := range fs {
		byDev[f.dev] = append(byDev[f.dev], f.frame)
	}
	var errs []error
	for _, dev := range slices.Sorted(maps.Keys(byDev)) {
		frames := byDev[dev]
		slices.Sort(frames)
		if err := s.src.Return(dev, frames); err != nil {
			errs = append(errs, fmt.Errorf("return %d frames of device %d %s: %w", len(frames), dev, what, err))
		}
	}
	return errors.Join(errs...)
}

// save copies a resident chunk's frame into the store and returns its key,
// or, if the chunk is clean, returns the key it kept. The caller holds
// allocMu.
func (s *Space) save(c *chunk) (uint64, error) {
	if c.stored {
		return c.key, nil
	}
	read := func(b []byte) error { return s.src.Read(c.dev, c.frame, b) }
	var key uint64
	var err error
	if s.lend != nil {
		key, err = s.lend.putFrom(read)
	} else {
		buf := framePool.Get().(*[FrameSize]byte)
		if err = read(buf[:]); err == nil {
			key, err = s.store.Put(buf[:])
		}
		framePool.Put(buf)
	}
	if err != nil {
		return 0, fmt.Errorf("evict chunk %#x of device %d (frame %#x): %w", c.va, c.dev, c.frame, err)
	}
	return key, nil
}

// load fills frame f with the contents of the evicted chunk c. The caller
// holds allocMu.
func (s *Space) load(c *chunk, f planFrame) error {
	var err error
	switch {
	case c.stored:
		err = s.stored(c, func(b []byte) error { return s.src.Write(c.dev, f.frame, b) })
	case f.reused: // a fresh frame reads as zero already
		err = s.src.Zero(c.dev, f.frame)
	}
	if err != nil {
		return fmt.Errorf("fault in chunk %#x of device %d (frame %#x): %w", c.va, c.dev, f.frame, err)
	}
	return nil
}

// stored calls use with the stored contents of c, lent by the store or
// copied out of it.
func (s *Space) stored(c *chunk, use func([]byte) error) error {
	if s.lend != nil {
		return s.lend.view(c.key, use)
	}
	buf := framePool.Get().(*[FrameSize]byte)
	defer framePool.Put(buf)
	if err := s.store.Get(c.key, buf[:]); err != nil {
		return err
	}
	return use(buf[:])
}

// refill asks a source that is a Refiller to fill the frames p planned for
// the chunks it needs from memory the source holds, one request per
// device, for each chunk whose frame the source sealed before it was
// evicted (so that a node may retain it) and whose allocations are all
// sealed. It returns which it filled; the others are to be loaded. A miss
// costs a hash of the chunk, once per stored contents, and is not asked
// again; a failed request only leaves its chunks to be loaded, and is
// returned by device for the caller to report if loading fails too. The
// caller holds allocMu.
func (s *Space) refill(p *faultPlan) ([]bool, map[uint32]error) {
	hit := make([]bool, len(p.need))
	r, ok := s.src.(Refiller)
	if !ok {
		return hit, nil
	}
	type ask struct {
		idx    []int
		frames []uint64
		sums   [][32]byte
	}
	asks := map[uint32]*ask{}
	for i, c := range p.need {
		if !c.stored || !c.atSource || c.unsealed > 0 {
			continue
		}
		if !c.summed {
			if s.stored(c, func(b []byte) error { c.sum = sha256.Sum256(b); return nil }) != nil {
				continue // load reports it
			}
			c.summed = true
		}
		a := asks[c.dev]
		if a == nil {
			a = &ask{}
			asks[c.dev] = a
		}
		a.idx, a.frames, a.sums = append(a.idx, i), append(a.frames, p.frames[i].frame), append(a.sums, c.sum)
	}
	var errs map[uint32]error
	for dev, a := range asks {
		got, err := r.Refill(dev, a.frames, a.sums)
		if err == nil && len(got) != len(a.frames) {
			err = fmt.Errorf("refill of %d frames answered %d: %w", len(a.frames), len(got), vocab.ErrInternal)
		}
		if err != nil {
			if errs == nil {
				errs = map[uint32]error{}
			}
			errs[dev] = fmt.Errorf("refill %d frames of device %d: %w", len(a.frames), dev, err)
			continue
		}
		for k, i := range a.idx {
			hit[i] = got[k]
			if !got[k] {
				p.need[i].atSource = false // gone from the source: ask no more
			}
		}
	}
	return hit, errs
}

// evictLocked unmaps the resident chunk c, whose contents the store holds
// under key (the one it kept, if it is clean). The caller holds both locks
// and disposes of c's frame.
func (s *Space) evictLocked(c *chunk, key uint64) {
	if c.stored {
		s.cleanEvictions++
	} else {
		s.writeBacks++
	}
	c.runs(func(first, pages int) {
		s.pt.unmapRange(c.va+uint64(first)*Page4K, uint64(pages)*Page4K)
	})
	s.tlb.invalidate(c.va, Page2M)
	s.dropResident(c)
	c.atSource = c.atSource || c.frameSealed
	if !c.stored { // written back: new contents, whose sum refill takes anew
		c.summed = false
	}
	c.resident, c.stored, c.key, c.frameSealed = false, true, key, false
	s.evicted++
	s.evictions++
}

// dropKey drops the store entry c holds. The caller holds allocMu.
func (s *Space) dropKey(c *chunk) {
	s.store.Drop(c.key)
	c.stored, c.key = false, 0
}

// mapChunk maps the allocated pages of the resident chunk c. The caller
// holds both locks.
func (s *Space) mapChunk(c *chunk) {
	c.runs(func(first, pages int) {
		off := uint64(first) * Page4K
		s.pt.mapRange(c.va+off, c.frame+off, uint64(pages)*Page4K)
	})
}

// Shrink evicts up to n of the space's resident chunks, coldest first (see
// colder), saving their contents to the store and returning their frames
// to the source, and says how many it evicted. The owner of spaces that
// share a budget of frames (a container's sessions) uses it to move frames
// from one to another; like any eviction, it must not come between another
// command's translation and its send.
func (s *Space) Shrink(n int) (evicted int, err error) {
	for evicted < n {
		ok, err := s.evict(0)
		if ok {
			evicted++
		}
		if err != nil || !ok {
			return evicted, err
		}
	}
	return evicted, nil
}

// evict evicts the resident chunk that contains va or, with va 0, the
// coldest resident chunk (see colder), and returns its frame. It reports
// whether it evicted one; on failure nothing changes. Shrink uses it, and
// tests, to interleave evictions with everything else.
func (s *Space) evict(va uint64) (bool, error) {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	switch {
	case s.closed:
		return false, fmt.Errorf("evict %#x: %w", va, errClosed)
	case s.store == nil:
		return false, fmt.Errorf("evict %#x: the space does not oversubscribe: %w", va, vocab.ErrInvalidArgument)
	}
	var c *chunk
	if va == 0 {
		s.pinEpoch++
		all := s.residentChunks()
		s.mu.Lock()
		if cs := s.coldest(all, 1, lastRank); len(cs) == 1 {
			c = cs[0]
		}
		s.mu.Unlock()
	} else {
		c = s.chunks[va&^(Page2M-1)]
	}
	if c == nil || !c.resident {
		return false, nil
	}
	err := s.evictNow([]*chunk{c})
	return !c.resident, err
}
