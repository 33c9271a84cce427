package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

// tracked wraps the workload for --state-bind-address: it records each
// batch in the truth as Run takes it, and parks Next for good once paused.
// Run publishes a batch before it asks for the next one, so once Next is
// parked every batch recorded was published.
type tracked struct {
	w     fakeengine.Workload
	truth *fakeengine.Truth
	ctx   context.Context

	pause     chan struct{} // closed by the first POST /pause
	pauseOnce sync.Once
	idle      chan struct{} // closed once no batch is in flight any more: Next parked, or Run done
	idleOnce  sync.Once
}

func newTracked(ctx context.Context, w fakeengine.Workload, blockSize int) *tracked {
	return &tracked{w: w, truth: fakeengine.NewTruth(blockSize), ctx: ctx, pause: make(chan struct{}), idle: make(chan struct{})}
}

// Next implements fakeengine.Workload.
func (t *tracked) Next() (fakeengine.Batch, time.Duration, bool) {
	select {
	case <-t.pause:
		t.setIdle()
		<-t.ctx.Done()
		return fakeengine.Batch{}, 0, false
	default:
	}
	b, after, ok := t.w.Next()
	if ok {
		t.truth.Apply(b)
	}
	return b, after, ok
}

func (t *tracked) setIdle() { t.idleOnce.Do(func() { close(t.idle) }) }

// blocksBody is GET /blocks: the keys (16 hex digits, sorted) of the blocks
// the engine holds per the batches it published.
type blocksBody struct {
	Blocks  int      `json:"blocks"`
	Unkeyed int      `json:"unkeyed"`
	Paused  bool     `json:"paused"`
	Keys    []string `json:"keys"`
}

func (t *tracked) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /blocks", func(w http.ResponseWriter, _ *http.Request) {
		keys, unkeyed := t.truth.Keys()
		body := blocksBody{Blocks: len(keys), Unkeyed: unkeyed, Keys: make([]string, len(keys))}
		for i, k := range keys {
			body.Keys[i] = fmt.Sprintf("%016x", k)
		}
		select {
		case <-t.idle:
			body.Paused = true
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	})
	// POST /pause stops publishing for good (the sockets stay open, replay
	// is served) and answers once the last batch taken was published.
	mux.HandleFunc("POST /pause", func(w http.ResponseWriter, r *http.Request) {
		t.pauseOnce.Do(func() { close(t.pause) })
		select {
		case <-t.idle:
			w.WriteHeader(http.StatusNoContent)
		case <-time.After(10 * time.Second):
			http.Error(w, "the publish loop did not stop within 10 s", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	})
	return mux
}

// serveState serves t on addr until ctx ends; it returns the bound address.
func serveState(ctx context.Context, addr string, t *tracked) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("cannot listen on --state-bind-address %s: %w", addr, err)
	}
	srv := &http.Server{Handler: t.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return lis.Addr().String(), nil
}
