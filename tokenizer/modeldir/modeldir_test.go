package modeldir

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tinyTokenizer is a char-level BPE over a few letters, with "<s>" as a
// special token and one merge ("h i" -> "hi").
func tinyTokenizer() []byte {
	vocab := map[string]int{"<unk>": 0, "<s>": 1}
	for i, r := range "abcdefghijklmnopqrstuvwxyzU:A \n" {
		vocab[string(r)] = 2 + i
	}
	vocab["hi"] = len(vocab)
	doc := map[string]any{
		"added_tokens": []map[string]any{{"id": 1, "content": "<s>", "special": true}},
		"normalizer":   nil, "pre_tokenizer": nil,
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h i"}, "unk_token": "<unk>"},
	}
	b, _ := json.Marshal(doc)
	return b
}

const tinyConfig = `{"bos_token": "<s>", "chat_template": "{{ bos_token }}U:{{ messages[0]['content'] }}\nA:"}`

func writeModel(t *testing.T, root, id, tok, cfg string) {
	t.Helper()
	dir := filepath.Join(root, filepath.FromSlash(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tok), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if cfg != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type countObserver struct {
	ok, loadOK, loadErr atomic.Int64
	mu                  sync.Mutex
	fails               map[string]int
}

func (o *countObserver) Tokenized(time.Duration) { o.ok.Add(1) }
func (o *countObserver) TokenizeFailed(r string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fails == nil {
		o.fails = map[string]int{}
	}
	o.fails[r]++
}
func (o *countObserver) TokenizerLoaded(ok bool) {
	if ok {
		o.loadOK.Add(1)
	} else {
		o.loadErr.Add(1)
	}
}
func (o *countObserver) failures(r string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fails[r]
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestModelPath(t *testing.T) {
	for _, id := range []string{"m", "meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen3-8B", "a/b/c", "a.b", "..a", "模型"} {
		p, err := ModelPath("/root", id)
		if err != nil {
			t.Errorf("%q: %v", id, err)
			continue
		}
		if want := filepath.Join("/root", filepath.FromSlash(id)); p != want {
			t.Errorf("%q: got %q, want %q", id, p, want)
		}
	}
	for _, id := range []string{"", "/abs", "../x", "a/../../b", "a/..", "a//b", "a/", "./a", ".", "..", `a\b`, "a\x00b", "a\nb", "c:x",
		strings.Repeat("x", 513), "\xff"} {
		if _, err := ModelPath("/root", id); !errors.Is(err, ErrInvalidModel) {
			t.Errorf("%q: got %v, want ErrInvalidModel", id, err)
		}
	}
}

func TestEncode(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "org/tiny", string(tinyTokenizer()), tinyConfig)
	obs := &countObserver{}
	d, err := New(Config{Root: root, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ids, err := d.Encode(ctx, "org/tiny", "hi ab")
			if err != nil {
				t.Error(err)
				return
			}
			// <s> U : hi ' ' a b \n A :
			want := []uint32{1, 28, 29, 33, 31, 2, 3, 32, 30, 29}
			if !equal(ids, want) {
				t.Errorf("got %v, want %v", ids, want)
			}
		})
	}
	wg.Wait()
	if n := obs.loadOK.Load(); n != 1 {
		t.Errorf("%d loads for 8 concurrent first requests, want 1", n)
	}
	if n := obs.ok.Load(); n != 8 {
		t.Errorf("%d tokenizations counted, want 8", n)
	}
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFailedLoadBackoff: a missing folder fails, is remembered for
// RetryAfter (no new load), and is loaded again after it.
func TestFailedLoadBackoff(t *testing.T) {
	root := t.TempDir()
	obs := &countObserver{}
	clk := &clock{t: time.Unix(1000, 0)}
	d, err := New(Config{Root: root, Observer: obs, RetryAfter: time.Minute, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		_, err := d.Encode(ctx, "late", "x")
		var e *Error
		if !errors.As(err, &e) || e.Reason != ReasonNotFound {
			t.Fatalf("got %v, want a %s error", err, ReasonNotFound)
		}
	}
	if n := obs.loadErr.Load(); n != 1 {
		t.Errorf("%d load attempts within the retry window, want 1", n)
	}
	if n := obs.failures(ReasonNotFound); n != 3 {
		t.Errorf("%d not_found failures counted, want 3", n)
	}
	writeModel(t, root, "late", string(tinyTokenizer()), tinyConfig)
	clk.add(30 * time.Second)
	if _, err := d.Encode(ctx, "late", "x"); err == nil {
		t.Fatal("loaded again within the retry window")
	}
	clk.add(31 * time.Second)
	if _, err := d.Encode(ctx, "late", "x"); err != nil {
		t.Fatalf("after the retry window: %v", err)
	}
}

func TestFailureReasons(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "broken", `{"model": {"type": "BPE", "vocab": {`, tinyConfig)
	writeModel(t, root, "unsupported", `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, tinyConfig)
	writeModel(t, root, "noconfig", string(tinyTokenizer()), "")
	writeModel(t, root, "notemplate", string(tinyTokenizer()), `{"bos_token": "<s>"}`)
	writeModel(t, root, "raises", string(tinyTokenizer()), `{"chat_template": "{{ raise_exception('no') }}"}`)
	writeModel(t, root, "nounk", `{"model": {"type": "BPE", "vocab": {"a": 0, "U": 1, ":": 2}, "merges": []}}`, `{"chat_template": "U:{{ messages[0].content }}"}`)
	d, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{
		"broken": ReasonLoadFailed, "unsupported": ReasonLoadFailed, "noconfig": ReasonNoTemplate,
		"notemplate": ReasonNoTemplate, "raises": ReasonRenderFailed, "nounk": ReasonEncodeFailed,
		"missing": ReasonNotFound, "../etc": ReasonInvalidModel,
	} {
		_, err := d.Encode(context.Background(), id, "ab")
		var e *Error
		if !errors.As(err, &e) || e.Reason != want {
			t.Errorf("%s: got %v, want reason %s", id, err, want)
		}
	}
}

func TestCanceledWhileLoading(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "m", string(tinyTokenizer()), tinyConfig)
	d, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Encode(ctx, "m", "x"); !errors.Is(err, context.Canceled) {
		// The load may win the race; then tokenizing sees ctx only per 64 KiB.
		if err != nil {
			t.Errorf("got %v", err)
		}
	}
}

func TestNewRejectsMissingRoot(t *testing.T) {
	if _, err := New(Config{Root: filepath.Join(t.TempDir(), "nope")}); err == nil {
		t.Error("missing root: no error")
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Root: f}); err == nil {
		t.Error("file root: no error")
	}
}
