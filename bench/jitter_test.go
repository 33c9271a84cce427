package bench

import (
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// TestJitter: every arrival moves by at most d and never before 0, the
// stream stays sorted with IDs renumbered, the same seed gives the same
// stream and another seed another one, and d <= 0 changes nothing.
func TestJitter(t *testing.T) {
	base := make([]workload.Request, 500)
	for i := range base {
		// Pairs 1 ms apart, so a 10 ms jitter reorders some of them.
		base[i] = workload.Request{ID: i, Arrival: time.Duration(i/2) * 20 * time.Millisecond, Blocks: []uint64{uint64(i + 1)}, BlockSize: 16, InputTokens: 16, OutputTokens: 1}
		if i%2 == 1 {
			base[i].Arrival += time.Millisecond
		}
	}
	const d = 10 * time.Millisecond
	a := slices.Clone(base)
	Jitter(a, d, 7)
	if err := workload.ValidateStream(a); err != nil {
		t.Fatal(err)
	}
	reordered := false
	for i, r := range a {
		if r.ID != i {
			t.Fatalf("request %d has ID %d", i, r.ID)
		}
		orig := base[r.Blocks[0]-1]
		if diff := r.Arrival - orig.Arrival; r.Arrival < 0 || diff > d || (diff < -d && r.Arrival != 0) {
			t.Fatalf("request %d moved from %v to %v (jitter %v)", orig.ID, orig.Arrival, r.Arrival, d)
		}
		reordered = reordered || int(r.Blocks[0]-1) != i
	}
	if !reordered {
		t.Fatal("a 10 ms jitter of arrivals 1 ms apart reordered none")
	}
	b := slices.Clone(base)
	Jitter(b, d, 7)
	c := slices.Clone(base)
	Jitter(c, d, 8)
	same := func(x, y []workload.Request) bool {
		return slices.EqualFunc(x, y, func(p, q workload.Request) bool { return p.Arrival == q.Arrival && p.Blocks[0] == q.Blocks[0] })
	}
	if !same(a, b) {
		t.Fatal("same seed, different streams")
	}
	if same(a, c) {
		t.Fatal("seeds 7 and 8 gave the same stream")
	}
	z := slices.Clone(base)
	Jitter(z, 0, 7)
	if !same(z, base) {
		t.Fatal("jitter 0 changed the stream")
	}
}
