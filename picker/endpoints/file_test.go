package endpoints

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitTimeout bounds every wait for a source to catch up (generous: CI
// machines are loaded).
const waitTimeout = 30 * time.Second

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu       sync.Mutex
	changes  []int          // PoolChanged arguments, in order
	failures map[string]int // ReloadFailed reasons
}

func (r *recorder) PoolChanged(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, n)
}

func (r *recorder) ReloadFailed(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == nil {
		r.failures = map[string]int{}
	}
	r.failures[reason]++
}

func (r *recorder) counts() (changes int, failures map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := make(map[string]int, len(r.failures))
	for k, v := range r.failures {
		f[k] = v
	}
	return len(r.changes), f
}

// waitFor polls cond until it holds or waitTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// poolFile is an endpoints file with n endpoints.
func poolFile(n int, extra string) string {
	var b strings.Builder
	b.WriteString("tenant: ns\nendpoints:\n")
	for i := range n {
		fmt.Fprintf(&b, "- replicaId: pod-%d\n  address: 10.0.0.%d:8000\n", i, i+1)
	}
	b.WriteString(extra)
	return b.String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAtomic replaces path by a rename, so the source never reads a
// half-written file (an in-place write can be read between its truncate and
// its write on a loaded machine, which would count a failure). The new file
// is written in another directory, so the watched one sees one event, and
// one read follows it.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), filepath.Base(path))
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startFile makes a File source on path and runs it until the test ends;
// it returns once the watch is set up (Run's first read is done).
func startFile(t *testing.T, path string, opts ...Option) (*File, *recorder) {
	t.Helper()
	rec := &recorder{}
	f, err := NewFile(path, append([]Option{WithObserver(rec)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return within %s of its context ending", waitTimeout)
		}
	})
	waitFor(t, "Run's first read", func() bool { return f.reads.Load() >= 2 })
	return f, rec
}

func TestNewFileRefusesBadFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := NewFile(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "tenant: ns\nendpoints:\n- replicaId: a\n  adress: 10.0.0.1:80\n")
	_, err := NewFile(bad)
	if !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `"endpoints[0].adress"`) {
		t.Errorf("bad file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, poolFile(1, "# "+strings.Repeat("x", MaxFileBytes)+"\n"))
	if _, err := NewFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: %v", err)
	}
}

func TestFileLoadsJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.json")
	writeFile(t, path, sampleJSON)
	rec := &recorder{}
	f, err := NewFile(path, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Synced():
	default:
		t.Fatal("a File is synced once NewFile returns")
	}
	if p := f.Pool(); p.Len() != 2 || p.HashScheme != "sglang" || p.Resolve("my-lora").AdapterID != "my-lora" {
		t.Fatalf("pool %+v", p)
	}
	if n, _ := rec.counts(); n != 1 {
		t.Fatalf("PoolChanged called %d times by NewFile, want 1", n)
	}
}

// Each edit style is seen through the directory watch alone (no resync).
func TestFileReloadOnWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(1, ""))
	f, rec := startFile(t, path, WithResyncInterval(0))
	writeFile(t, path, poolFile(2, "")) // in place: truncate, then write
	waitFor(t, "2 endpoints", func() bool { return f.Pool().Len() == 2 })
	if n, _ := rec.counts(); n != 2 {
		t.Fatalf("PoolChanged called %d times, want 2", n)
	}
}

func TestFileReloadOnAtomicRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, path, poolFile(1, ""))
	f, _ := startFile(t, path, WithResyncInterval(0))
	tmp := filepath.Join(dir, ".endpoints.yaml.tmp")
	writeFile(t, tmp, poolFile(3, ""))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 endpoints", func() bool { return f.Pool().Len() == 3 })
	// The file was replaced: a second rename must be seen too (the watch
	// is on the directory, not on the replaced inode).
	writeFile(t, tmp, poolFile(4, ""))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "4 endpoints", func() bool { return f.Pool().Len() == 4 })
}

// TestFileReloadConfigMapSwap replays how the kubelet updates a ConfigMap
// volume: the file is a symlink into ..data, itself a symlink to a
// timestamped directory; an update writes a new directory, points a new
// ..data_tmp symlink at it and renames it over ..data.
func TestFileReloadConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "endpoints.yaml"), content)
	}
	version("..2026_01_01_00_00_00.1", poolFile(1, ""))
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "endpoints.yaml")
	if err := os.Symlink(filepath.Join("..data", "endpoints.yaml"), path); err != nil {
		t.Fatal(err)
	}
	f, _ := startFile(t, path, WithResyncInterval(0))

	for i, n := range []int{2, 5} {
		next := fmt.Sprintf("..2026_01_01_00_00_0%d.1", i+1)
		version(next, poolFile(n, ""))
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(next, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("%d endpoints after swap %d", n, i+1), func() bool { return f.Pool().Len() == n })
	}
}

func TestFileBadEditKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(2, ""))
	f, rec := startFile(t, path, WithResyncInterval(0))
	good := f.Pool()

	failures := func(reason string) func() bool {
		return func() bool { _, fails := rec.counts(); return fails[reason] > 0 }
	}
	writeAtomic(t, path, poolFile(2, "tennant: typo\n"))
	waitFor(t, "a decode failure", failures(ReasonDecode))
	if f.Pool() != good {
		t.Fatal("a bad edit replaced the pool")
	}
	// The same bad content again is read but not counted again.
	reads := f.reads.Load()
	writeAtomic(t, path, poolFile(2, "tennant: typo\n"))
	waitFor(t, "the rewrite to be read", func() bool { return f.reads.Load() > reads })
	writeAtomic(t, path, "tenant: ns\nendpoints:\n- replicaId: a\n  address: not-an-ip:80\n")
	waitFor(t, "an invalid failure", failures(ReasonInvalid))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a read failure", failures(ReasonRead))
	if f.Pool() != good {
		t.Fatal("a bad edit replaced the pool")
	}
	if n, fails := rec.counts(); n != 1 || fails[ReasonDecode] != 1 || fails[ReasonInvalid] != 1 || fails[ReasonRead] != 1 {
		t.Fatalf("changes %d failures %v; want 1 change, one failure of each reason", n, fails)
	}

	writeFile(t, path, poolFile(3, ""))
	waitFor(t, "the fixed file", func() bool { return f.Pool().Len() == 3 })
}

func TestFileUnchangedPublishesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(2, ""))
	f, rec := startFile(t, path, WithResyncInterval(0))
	first := f.Pool()
	for i, content := range []string{
		poolFile(2, ""),                 // the same bytes
		poolFile(2, "# a comment\n"),    // other bytes, the same pool
		poolFile(2, "hashScheme: vllm"), // the default, spelled out
	} {
		reads := f.reads.Load()
		writeAtomic(t, path, content)
		waitFor(t, fmt.Sprintf("rewrite %d to be read", i), func() bool { return f.reads.Load() > reads })
	}
	if f.Pool() != first {
		t.Fatal("an unchanged pool was published again")
	}
	if n, fails := rec.counts(); n != 1 || len(fails) != 0 {
		t.Fatalf("changes %d, failures %v; want only NewFile's change", n, fails)
	}
}

// Without the watch, the periodic re-read alone picks changes up.
func TestFileResyncFallback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(1, ""))
	f, _ := startFile(t, path, WithResyncInterval(20*time.Millisecond), func(o *options) { o.noWatch = true })
	writeFile(t, path, poolFile(2, ""))
	waitFor(t, "the resync to see 2 endpoints", func() bool { return f.Pool().Len() == 2 })
}

func TestFileRunTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(1, ""))
	f, _ := startFile(t, path)
	if err := f.Run(context.Background()); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
}

// Readers never see a torn pool while edits are published.
func TestFileConcurrentReaders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeFile(t, path, poolFile(1, ""))
	f, _ := startFile(t, path, WithResyncInterval(0))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				p := f.Pool()
				for _, ep := range p.Endpoints {
					if got, ok := p.ByReplica(ep.ReplicaID); !ok || got != ep {
						t.Errorf("torn pool: %+v", p)
						return
					}
				}
			}
		})
	}
	for n := 2; n <= 6; n++ {
		writeFile(t, path, poolFile(n, ""))
		waitFor(t, fmt.Sprintf("%d endpoints", n), func() bool { return f.Pool().Len() == n })
	}
	cancel()
	wg.Wait()
}
