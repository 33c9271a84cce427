package engine

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
)

// benchWorkload is the benchmark workload: one tenant, model and
// scheme; 32 replicas; prompts of 64 blocks x 16 tokens sharing an 8-block
// system prefix; each prompt held by 1 to 3 replicas. With 20,000 prompts
// that is about 2.25M storage entries over 1.1M distinct keys, and a lookup
// of a stored prompt scores all 32 replicas (every replica holds the
// system prefix).
type benchWorkload struct {
	prompts  int
	replicas []string
	holders  [][]int // prompt -> replica indexes
	sys      [][]byte
	counts   []int32
}

const (
	benchBlocks    = 64
	benchSysBlocks = 8
	benchTenant    = "bench"
	benchModel     = "llama-3-8b"
	benchScheme    = "vllm"
)

func newBenchWorkload(prompts int) *benchWorkload {
	w := &benchWorkload{prompts: prompts}
	for i := 0; i < 32; i++ {
		w.replicas = append(w.replicas, fmt.Sprintf("vllm-%02d", i))
	}
	r := rand.New(rand.NewPCG(42, 7))
	for p := 0; p < prompts; p++ {
		n := 1 + r.IntN(3)
		perm := r.Perm(32)[:n]
		w.holders = append(w.holders, perm)
	}
	for j := 0; j < benchSysBlocks; j++ {
		w.sys = append(w.sys, binary.BigEndian.AppendUint64(nil, mix64(uint64(j)+0xabcdef)))
	}
	for range benchBlocks {
		w.counts = append(w.counts, 16)
	}
	return w
}

// chain appends prompt p's 64 block hashes to dst (reusing its byte slices).
func (w *benchWorkload) chain(dst [][]byte, buf []byte, p int) ([][]byte, []byte) {
	dst = append(dst[:0], w.sys...)
	buf = buf[:0]
	for j := benchSysBlocks; j < benchBlocks; j++ {
		buf = binary.BigEndian.AppendUint64(buf, mix64(uint64(p)<<8|uint64(j)))
	}
	for j := 0; j < benchBlocks-benchSysBlocks; j++ {
		dst = append(dst, buf[j*8:j*8+8])
	}
	return dst, buf
}

// forEachUpdate calls fn with one chain update per (prompt, holder). The
// update and its slices are reused between calls.
func (w *benchWorkload) forEachUpdate(now int64, fn func(u *Update)) {
	var hashes [][]byte
	var buf []byte
	u := &Update{TenantID: benchTenant, ModelID: benchModel, HashScheme: benchScheme, TimestampUs: now, Prefixes: make([]PrefixEntry, 1)}
	for p := 0; p < w.prompts; p++ {
		hashes, buf = w.chain(hashes, buf, p)
		for _, h := range w.holders[p] {
			u.ReplicaID = w.replicas[h]
			u.Prefixes[0] = PrefixEntry{BlockHashes: hashes, BlockTokenCounts: w.counts}
			fn(u)
		}
	}
}
