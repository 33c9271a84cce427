package engine

import "unsafe"

// MemoryStats breaks down the index's memory. Arena bytes are exact (the
// slabs are the memory); table and queue bytes are exact capacities; the
// overhead of Go-side structures (domains, scopes, replica records and their
// name strings, serving sets) is computed from their sizes and counts.
type MemoryStats struct {
	// ArenaSlabBytes is the memory the arena holds; ArenaLiveBytes is the
	// part in live nodes, holder blocks and hash bytes.
	ArenaSlabBytes, ArenaLiveBytes int64
	// TableBytes is the scope hash tables and the routing-time entries
	// (fixed at New, LoadConfig.ExpectedBytes).
	TableBytes int64
	// QueueBytes is the eviction queues (records and buckets).
	QueueBytes int64
	// OverheadBytes is the Go-side bookkeeping: domains, schemes, scopes,
	// replica records and names, stats payloads, serving sets.
	OverheadBytes int64
	// IndexBytes is what the byte budget (Config.MaxBytes) is checked
	// against: the memory that evicting entries gives back, namely arena
	// live bytes, tables and queues. The overhead is left out: evicting
	// entries cannot free a stats-only replica or an empty domain (the
	// sweep reclaims those), so charging it would let bookkeeping a client
	// creates (say, 40,000 stats-only tenants) make the budget evict every
	// live entry. Freed arena blocks are reused before the arena grows, so
	// the arena's slab footprint tracks IndexBytes' high-water mark plus
	// one slab.
	IndexBytes int64
	// TotalBytes is what the index holds from the Go runtime: slabs,
	// tables, queues and overhead.
	TotalBytes int64
	// Entries and Keys are the storage entries and distinct keys (reserved
	// tenant excluded).
	Entries, Keys int64
}

// Memory reports the index's memory. It takes the writer lock briefly.
func (e *Engine) Memory() MemoryStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.arena.Stats()
	m := MemoryStats{
		ArenaSlabBytes: int64(a.SlabBytes),
		ArenaLiveBytes: int64(a.LiveBytes),
		TableBytes:     e.tableBytes + e.expect.bytes(),
		QueueBytes:     e.queueBytesLocked(),
		OverheadBytes:  e.overheadBytesLocked(),
		Entries:        e.totalEntries.Load(),
		Keys:           e.totalKeys.Load(),
	}
	m.IndexBytes = m.ArenaLiveBytes + m.TableBytes + m.QueueBytes
	m.TotalBytes = m.ArenaSlabBytes + m.TableBytes + m.QueueBytes + m.OverheadBytes
	return m
}

func (e *Engine) queueBytesLocked() int64 {
	n := e.capAcct.bytes()
	for _, q := range e.quotas {
		n += q.bytes()
	}
	return n
}

// overheadBytesLocked sizes the Go-side structures.
func (e *Engine) overheadBytesLocked() int64 {
	n := int64(cap(e.scopes))*8 + int64(cap(e.freeSlots))*int64(unsafe.Sizeof(freeSlot{}))
	for _, sc := range e.scopes {
		if sc != nil {
			n += int64(unsafe.Sizeof(scope{})) + 16 + int64(len(sc.adapter))
		}
	}
	const mapEntry = 64 // a map or xsync entry with its key
	n += int64(len(e.modelKeys)) * (mapEntry + int64(unsafe.Sizeof(modelCount{})))
	e.tenants.Range(func(id string, _ *tenantState) bool {
		n += mapEntry + int64(unsafe.Sizeof(tenantState{})) + int64(len(id))
		return true
	})
	e.domains.Range(func(_ domainKey, d *domain) bool {
		n += int64(unsafe.Sizeof(domain{})) + mapEntry + int64(len(d.tenant)+len(d.model)) + 8
		n += int64(cap(d.freeIDs)) * int64(unsafe.Sizeof(freeID{}))
		for _, r := range d.replicaSlots() {
			n += 8 + 2
			if r != nil {
				n += int64(unsafe.Sizeof(replica{})) + int64(len(r.name)) + int64(cap(r.schemeKeys))*4 + mapEntry
				if r.stats.Load() != nil {
					n += int64(unsafe.Sizeof(statsRecord{}))
				}
			}
		}
		if p := d.schemes.Load(); p != nil {
			for _, s := range *p {
				ss := s.serving.Load()
				n += int64(unsafe.Sizeof(scheme{})) + int64(len(s.name)) + 8 + int64(cap(ss.ids))*2 + int64(cap(ss.names))*16
			}
		}
		return true
	})
	return n
}

// indexBytesLocked is MemoryStats.IndexBytes, for the byte budget check.
func (e *Engine) indexBytesLocked() int64 {
	return int64(e.arena.Stats().LiveBytes) + e.tableBytes + e.expect.bytes() + e.queueBytesLocked()
}
