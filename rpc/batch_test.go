package rpc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
)

// gateIndex is a batchIndex whose first IngestBatch blocks until release is
// closed; every call records its batch and answers Entries = the update's
// timestamp, so each stream can check it got its own result.
type gateIndex struct {
	entered chan struct{} // closed when the first call starts
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	sizes   []int
}

func (g *gateIndex) IngestBatch(items []engine.BatchItem) {
	g.once.Do(func() { close(g.entered); <-g.release })
	g.mu.Lock()
	g.sizes = append(g.sizes, len(items))
	g.mu.Unlock()
	for i := range items {
		items[i].Result = engine.IngestResult{Entries: int(items[i].Update.TimestampUs)}
	}
}

func (*gateIndex) KnowsDomain(string, string) bool { return true }

// TestIngestBatcherCombines: while one stream's update holds the index,
// the updates other streams send meanwhile are applied together in one
// IngestBatch, each stream gets its own update's result, and every update
// is applied exactly once.
func TestIngestBatcherCombines(t *testing.T) {
	const streams = 8
	g := &gateIndex{entered: make(chan struct{}), release: make(chan struct{})}
	b := &ingestBatcher{idx: g}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan string, streams)
	run := func(id int) {
		defer wg.Done()
		r := newIngestReq()
		for k := 1; k <= 3; k++ {
			want := id*100 + k
			r.u, r.now = &engine.Update{TimestampUs: int64(want)}, 0
			b.ingest(r)
			if r.res.Entries != want {
				errs <- "a stream got another update's result"
				return
			}
		}
	}
	wg.Add(1)
	go run(0) // becomes the applier and blocks in the index
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the first update never reached the index")
	}
	for id := 1; id < streams; id++ {
		wg.Add(1)
		go run(id)
	}
	for !queued(b, streams-1) {
		if ctx.Err() != nil {
			t.Fatal("the other streams never queued")
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	total := 0
	for _, n := range g.sizes {
		total += n
	}
	if total != 3*streams {
		t.Fatalf("applied %d updates in batches %v, want %d", total, g.sizes, 3*streams)
	}
	if len(g.sizes) < 2 || g.sizes[1] < streams-1 {
		t.Fatalf("batches %v: the %d updates queued behind the first were not applied together", g.sizes, streams-1)
	}
	if bs, us := b.batches.Load(), b.updates.Load(); us != int64(total) || bs != int64(len(g.sizes)) {
		t.Fatalf("counters %d batches / %d updates, want %d / %d", bs, us, len(g.sizes), total)
	}
}

// queued reports whether at least n updates wait in b's queue.
func queued(b *ingestBatcher, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) >= n
}

// panicIndex panics in IngestBatch.
type panicIndex struct{}

func (panicIndex) IngestBatch([]engine.BatchItem) { panic("index bug") }

func (panicIndex) KnowsDomain(string, string) bool { return true }

// TestIngestBatcherPanic: a panic in the index fails the applier (its
// panic propagates) and every stream batched with it (they panic too, so
// the server's recovery turns each into an error), and the batcher stays
// usable: the next update becomes the applier.
func TestIngestBatcherPanic(t *testing.T) {
	b := &ingestBatcher{idx: panicIndex{}}
	for range 2 {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the applier's panic was swallowed")
				}
			}()
			b.ingest(&ingestReq{u: &engine.Update{}, done: make(chan struct{}, 1)})
		}()
		if b.busy {
			t.Fatal("the batcher stayed busy after a panic")
		}
	}
}
