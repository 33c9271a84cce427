package controller

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/policy"
)

func nsKey(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

func TestServerClientRereadsToken(t *testing.T) {
	dir := t.TempDir()
	tokPath := filepath.Join(dir, "token")
	if err := os.WriteFile(tokPath, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// lastAuth is the Authorization header of the latest request, stored by
	// the handler goroutine and read by the test.
	var lastAuth atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		lastAuth.Store(&h)
		switch r.URL.Path {
		case "/policy":
			if _, err := policy.Decode(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case "/snapshot":
			_, _ = io.WriteString(w, `{"replicas":[],"tenants":[{"tenantId":"x","indexEntries":3,"hitRate":0,"memoryUsed":0}],"totalPrefixes":3,"hotPrefixes":0}`)
		}
	}))
	defer srv.Close()
	c := &ServerClient{BaseURL: srv.URL + "/", PolicyTokenPath: tokPath, ControllerTokenPath: tokPath}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.PushPolicy(ctx, BuildBody(nil, nil)); err != nil {
		t.Fatal(err)
	}
	if got := *lastAuth.Load(); got != "Bearer one" {
		t.Fatalf("Authorization %q", got)
	}
	// The kubelet rotates the projected token: the next request uses the new one.
	if err := os.WriteFile(tokPath, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := c.Snapshot(ctx)
	if err != nil || len(snap.Tenants) != 1 || snap.Tenants[0].IndexEntries != 3 {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
	if got := *lastAuth.Load(); got != "Bearer two" {
		t.Fatalf("Authorization %q after rotation", got)
	}
	if err := os.WriteFile(tokPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.PushPolicy(ctx, BuildBody(nil, nil)); !errors.Is(err, ErrEmptyToken) {
		t.Fatalf("empty token: %v", err)
	}
	c.PolicyTokenPath = filepath.Join(dir, "missing")
	if err := c.PushPolicy(ctx, BuildBody(nil, nil)); err == nil || !strings.Contains(err.Error(), "cannot read bearer token") {
		t.Fatalf("missing token: %v", err)
	}
}

func TestServerClientErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unsupported policy snapshot version", http.StatusBadRequest)
	}))
	defer srv.Close()
	c := &ServerClient{BaseURL: srv.URL}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.PushPolicy(ctx, BuildBody(nil, nil))
	if err == nil || !strings.Contains(err.Error(), "HTTP 400: unsupported policy snapshot version") {
		t.Fatalf("push error %v", err)
	}
	if _, err := c.Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Fatalf("snapshot error %v", err)
	}
	srv.Close()
	if err := c.PushPolicy(ctx, BuildBody(nil, nil)); err == nil {
		t.Fatal("push to a closed server succeeded")
	}
}

// TestServerClientProbeAnswer: a 200 whose stages are not each ok, failed or
// skipped is an error (it would otherwise pass as ProbeOK and put arbitrary
// values into the probe metric's result label).
func TestServerClientProbeAnswer(t *testing.T) {
	var body atomic.Value // the /probe answer of the next call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	c := &ServerClient{BaseURL: srv.URL}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := func(answer string, wantErr bool) {
		t.Helper()
		body.Store(answer)
		_, err := c.Probe(ctx, controlapi.ProbeRequest{Backend: "ns/b", Model: ProbeModel, HashScheme: "vllm"})
		if (err != nil) != wantErr {
			t.Errorf("answer %s: error %v, want error %t", answer, err, wantErr)
		}
	}
	f(`{"backend":"ns/b","ingest":"ok","routing":"ok","t2":"skipped"}`, false)
	f(`{"backend":"ns/b","ingest":"ok","routing":"failed","t2":"skipped","errors":[{"stage":"routing","message":"x"}]}`, false)
	f(`{}`, true)
	f(`{"backend":"ns/b","ingest":"ok","routing":"OK","t2":"skipped"}`, true)
	f(`{"backend":"ns/b","ingest":"passed","routing":"ok","t2":"skipped"}`, true)
}
