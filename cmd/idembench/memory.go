package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/memstat"
	"github.com/idemproxy/idemproxy/store/memory"
)

// memoryResult is the memory store's footprint.
type memoryResult struct {
	// Records completed records (mode noop: no stored response) were
	// inserted into a fresh store bounded at MaxEntries; BytesPerRecord is
	// the growth of HeapAlloc after GC divided by Records. It includes
	// the map and the key and command type strings each record keeps.
	Records        int     `json:"records"`
	MaxEntries     int     `json:"max_entries"`
	KeyLen         int     `json:"key_len"`
	BytesPerRecord float64 `json:"bytes_per_record"`

	// A flood of FloodKeys unique keys (4× the bound) is sent to a store
	// bounded at FloodMaxEntries. HeapByQuarter is HeapAlloc after GC,
	// relative to the empty store, after each quarter of the flood.
	FloodMaxEntries  int     `json:"flood_max_entries,omitempty"`
	FloodKeys        int     `json:"flood_keys,omitempty"`
	FloodRefused     int     `json:"flood_refused,omitempty"`
	FloodLen         int     `json:"flood_len,omitempty"`
	HeapByQuarter    []int64 `json:"flood_heap_by_quarter,omitempty"`
	FloodHeapAtBound int64   `json:"flood_heap_at_bound,omitempty"`
	FloodHeapAtEnd   int64   `json:"flood_heap_at_end,omitempty"`
	// FloodGrowthBytes is the heap growth over the flood's second half,
	// when the store is long full.
	FloodGrowthBytes int64 `json:"flood_growth_bytes"`
	FloodBounded     bool  `json:"flood_bounded"`
}

// defaultMemoryMaxEntries is IDEMPROXY_MEMORY_MAX_ENTRIES's default.
const defaultMemoryMaxEntries = 1_000_000

// measureMemory measures bytes per record with records records (0 skips)
// and the flood bound with a store bounded at floodMax (0 skips).
func measureMemory(records, floodMax int) (*memoryResult, error) {
	r := &memoryResult{}
	if records > 0 {
		r.Records = records
		r.MaxEntries = max(2*records, defaultMemoryMaxEntries)
		m := memory.New(memory.Options{MaxEntries: r.MaxEntries, SweepInterval: -1})
		defer m.Close()
		base := memstat.LiveHeap()
		ins := newInserter()
		for range records {
			ok, err := ins.insert(m)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, errors.New("memory: the store refused a record below its bound")
			}
		}
		grown := memstat.LiveHeap() - base
		r.KeyLen = ins.keyLen
		r.BytesPerRecord = float64(grown) / float64(records)
		runtime.KeepAlive(m)
	}

	if floodMax > 0 {
		m := memory.New(memory.Options{MaxEntries: floodMax, SweepInterval: -1})
		defer m.Close()
		r.FloodMaxEntries = floodMax
		r.FloodKeys = 4 * floodMax
		base := memstat.LiveHeap()
		ins := newInserter()
		for range 4 {
			for range floodMax {
				ok, err := ins.insert(m)
				if err != nil {
					return nil, err
				}
				if !ok {
					r.FloodRefused++
				}
			}
			r.HeapByQuarter = append(r.HeapByQuarter, memstat.LiveHeap()-base)
		}
		r.FloodLen = m.Len()
		r.FloodHeapAtBound = r.HeapByQuarter[0]
		r.FloodHeapAtEnd = r.HeapByQuarter[3]
		r.FloodGrowthBytes = r.HeapByQuarter[3] - r.HeapByQuarter[1]
		// Full well before half-way: the second half may not grow the heap
		// by more than noise (1 MiB, or 1% of what the store holds).
		slack := max(int64(1<<20), r.HeapByQuarter[1]/100)
		r.FloodBounded = r.FloodLen <= floodMax && r.FloodGrowthBytes <= slack
		runtime.KeepAlive(m)
	}
	return r, nil
}

// inserter claims and completes records the way the proxy does for one
// keyed POST that succeeds in mode noop.
type inserter struct {
	tenant uuid.UUID
	fp     idemproxy.Fingerprint
	ctx    context.Context
	keyLen int
}

func newInserter() *inserter {
	return &inserter{tenant: uuid.New(), fp: sha256.Sum256(requestBody), ctx: context.Background()}
}

// insert reports false when the store is full.
func (in *inserter) insert(m *memory.Store) (bool, error) {
	// A UUID key is the common case; the proxy keeps the header's own
	// string and builds the command type per request, so both are fresh
	// allocations here too.
	key := uuid.NewString()
	in.keyLen = len(key)
	owner := uuid.New()
	res, err := m.Claim(in.ctx, idemproxy.Claim{
		Tenant:      in.tenant,
		Key:         key,
		Fingerprint: in.fp,
		CommandID:   uuid.Must(uuid.NewV7()),
		CommandType: strings.Clone(pgbenchCmdType),
		Owner:       owner,
		Lease:       time.Minute,
	})
	if errors.Is(err, idemproxy.ErrFull) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("memory: claim: %w", err)
	}
	if !res.Claimed {
		return false, errors.New("memory: a fresh key was not claimed")
	}
	err = m.Complete(in.ctx, idemproxy.Completion{
		Tenant: in.tenant, Key: key, Owner: owner, Status: 201, TTL: 24 * time.Hour,
	})
	if err != nil {
		return false, fmt.Errorf("memory: complete: %w", err)
	}
	return true, nil
}
