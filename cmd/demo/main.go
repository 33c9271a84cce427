// Command demo is the README's run command: it exercises the cache plane on
// an embedded default workload and prints a report.
//
// Today it drives the engine in process (the gRPC server and load generator
// replace this as they land): it ingests a workload of 32 replicas holding
// 64-block prompts behind a shared 8-block system prompt, then measures
// LookupRoute latency serially and on every core, and the index's memory.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferencecache/inferencecache/engine"
)

func main() {
	prompts := flag.Int("prompts", 20000, "distinct 64-block prompts to index")
	dur := flag.Duration("duration", 2*time.Second, "how long each lookup phase runs")
	flag.Parse()
	if err := run(*prompts, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(prompts int, dur time.Duration) error {
	const blocks, sys = 64, 8
	replicas := make([]string, 32)
	for i := range replicas {
		replicas[i] = fmt.Sprintf("vllm-%02d", i)
	}
	hash := func(p, j int) []byte {
		if j < sys {
			p = -1
		}
		return binary.BigEndian.AppendUint64(nil, (uint64(p+1)<<8|uint64(j))*0x9E3779B97F4A7C15)
	}
	chain := func(p int) [][]byte {
		c := make([][]byte, blocks)
		for j := range c {
			c[j] = hash(p, j)
		}
		return c
	}
	counts := make([]int32, blocks)
	for i := range counts {
		counts[i] = 16
	}
	e := engine.New(engine.Config{MaxEntries: 0})
	r := rand.New(rand.NewPCG(1, 2))
	now := time.Now().UnixMicro()
	start := time.Now()
	written := 0
	for p := 0; p < prompts; p++ {
		c := chain(p)
		for _, h := range r.Perm(32)[:1+r.IntN(3)] {
			e.Ingest(&engine.Update{TenantID: "demo", ModelID: "llama", HashScheme: "vllm", ReplicaID: replicas[h], TimestampUs: now,
				Prefixes: []engine.PrefixEntry{{BlockHashes: c, BlockTokenCounts: counts}}}, now)
			written += blocks
		}
	}
	ingest := time.Since(start)
	mem := e.Memory()
	fmt.Printf("ingest: %d blocks in %v (%.2fM blocks/s), %d storage entries over %d keys\n",
		written, ingest.Round(time.Millisecond), float64(written)/ingest.Seconds()/1e6, mem.Entries, mem.Keys)
	fmt.Printf("memory: %.1f B per storage entry (%d MiB held)\n", float64(mem.TotalBytes)/float64(mem.Entries), mem.TotalBytes>>20)

	reqs := make([]engine.LookupRequest, 1024)
	for i := range reqs {
		reqs[i] = engine.LookupRequest{TenantID: "demo", ModelID: "llama", HashScheme: "vllm", BlockHashes: chain(r.IntN(prompts)), BlockTokenCounts: counts}
	}
	for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
		var total atomic.Int64
		lat := make([][]time.Duration, workers)
		var wg sync.WaitGroup
		deadline := time.Now().Add(dur)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res engine.LookupResult
				for i := 0; time.Now().Before(deadline); i++ {
					t0 := time.Now()
					e.LookupRoute(&reqs[i%len(reqs)], now, &res)
					if i%64 == 0 {
						lat[w] = append(lat[w], time.Since(t0))
					}
					total.Add(1)
				}
			}()
		}
		wg.Wait()
		all := slices.Concat(lat...)
		slices.Sort(all)
		q := func(f float64) time.Duration { return all[int(f*float64(len(all)-1))] }
		fmt.Printf("lookup (%d goroutine(s)): %.0f lookups/s, p50 %v, p99 %v, p99.9 %v\n",
			workers, float64(total.Load())/dur.Seconds(), q(0.5), q(0.99), q(0.999))
	}
	return nil
}
