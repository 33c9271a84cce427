package workload

import (
	"errors"
	"slices"
	"testing"
)

func TestChainBuilder(t *testing.T) {
	b := newChainBuilder(16)
	sys := b.newSegment(40)
	u1, a1, u2 := b.newSegment(10), b.newSegment(30), b.newSegment(5)
	other := b.newSegment(10)

	turn1, n1 := b.chain([]segment{sys, u1}, nil)
	if n1 != 50 || len(turn1) != 4 {
		t.Fatalf("turn 1: %d tokens in %d blocks, want 50 in 4", n1, len(turn1))
	}
	// Blocks 0 and 1 are pure system prompt; block 2 mixes the prompt's
	// tail and the user turn; block 3 is partial.
	peer, _ := b.chain([]segment{sys, other}, nil)
	if !slices.Equal(peer[:2], turn1[:2]) || peer[2] == turn1[2] || peer[3] == turn1[3] {
		t.Fatalf("a peer prompt shares %v with %v; want exactly the first two blocks", peer, turn1)
	}
	turn2, n2 := b.chain([]segment{sys, u1, a1, u2}, nil)
	if n2 != 85 || len(turn2) != 6 {
		t.Fatalf("turn 2: %d tokens in %d blocks, want 85 in 6", n2, len(turn2))
	}
	// The next turn reuses every full block of the previous prompt, but
	// not its partial last block, whose content has changed.
	if !slices.Equal(turn2[:3], turn1[:3]) || turn2[3] == turn1[3] {
		t.Fatalf("turn 2 %v vs turn 1 %v: want the three full blocks shared, the fourth not", turn2, turn1)
	}
	again, _ := b.chain([]segment{sys, u1}, nil)
	if !slices.Equal(again, turn1) {
		t.Fatalf("same prompt got %v, then %v", turn1, again)
	}
	seen := map[uint64]bool{}
	for _, ch := range [][]uint64{turn1, peer, turn2} {
		for _, id := range ch {
			seen[id] = true
		}
	}
	if len(seen) != 4+2+3 { // turn1: 4; peer: 2 new; turn2: 3 new
		t.Fatalf("%d distinct ids, want 9", len(seen))
	}
}

type generator interface{ Generate() ([]Request, error) }

func TestGeneratorsDeterministicAndValid(t *testing.T) {
	gens := map[string]func(seed uint64) generator{
		"chat":          func(s uint64) generator { c := DefaultChat(); c.Seed = s; return c },
		"rag":           func(s uint64) generator { c := DefaultRAG(); c.Seed = s; return c },
		"shared-prompt": func(s uint64) generator { c := DefaultSharedPrompt(); c.Seed = s; return c },
	}
	for name, mk := range gens {
		t.Run(name, func(t *testing.T) {
			a, err := mk(3).Generate()
			if err != nil {
				t.Fatal(err)
			}
			b, _ := mk(3).Generate()
			c, _ := mk(4).Generate()
			if err := ValidateStream(a); err != nil {
				t.Fatal(err)
			}
			if len(a) != len(b) {
				t.Fatal("same seed, different lengths")
			}
			same := len(a) == len(c)
			for i := range a {
				if !equalRequest(a[i], b[i]) {
					t.Fatalf("same seed, request %d differs", i)
				}
				if i < len(c) && !equalRequest(a[i], c[i]) {
					same = false
				}
			}
			if same {
				t.Fatal("different seeds gave the same workload")
			}
		})
	}
}

// leadShared returns the common leading run of two chains.
func leadShared(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSharedPromptStructure(t *testing.T) {
	c := DefaultSharedPrompt()
	c.Requests = 200
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	full := c.SystemPromptTokens / c.BlockSize // 128 full blocks of system prompt
	for i := 1; i < len(reqs); i++ {
		if got := leadShared(reqs[0].Blocks, reqs[i].Blocks); got != full {
			t.Fatalf("request %d shares %d leading blocks with request 0, want %d", i, got, full)
		}
	}
}

func TestChatSessionsGrow(t *testing.T) {
	c := DefaultChat()
	c.Sessions, c.Turns = 1, Range{5, 5}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want 5", len(reqs))
	}
	for i := 1; i < len(reqs); i++ {
		prev, cur := reqs[i-1], reqs[i]
		if cur.InputTokens <= prev.InputTokens+prev.OutputTokens {
			t.Fatalf("turn %d: %d tokens, previous turn had %d+%d", i, cur.InputTokens, prev.InputTokens, prev.OutputTokens)
		}
		fullPrev := prev.InputTokens / prev.BlockSize
		if got := leadShared(prev.Blocks, cur.Blocks); got != fullPrev {
			t.Fatalf("turn %d shares %d blocks with turn %d, want its %d full blocks", i, got, i-1, fullPrev)
		}
	}
}

func TestRAGSharesChunks(t *testing.T) {
	c := DefaultRAG()
	c.Requests = 300
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	sysBlocks := c.SystemPromptTokens / c.BlockSize
	deeper := 0
	for i := 1; i < len(reqs); i++ {
		n := leadShared(reqs[0].Blocks, reqs[i].Blocks)
		if n < sysBlocks {
			t.Fatalf("request %d shares only %d blocks of the system prompt", i, n)
		}
		for j := 0; j < i && deeper == 0; j++ {
			if leadShared(reqs[j].Blocks, reqs[i].Blocks) >= sysBlocks+c.ChunkTokens/c.BlockSize {
				deeper++
			}
		}
	}
	if deeper == 0 {
		t.Fatal("no two requests share a corpus chunk; Zipf popularity should make that common")
	}
}

func TestGeneratorConfigErrors(t *testing.T) {
	f := func(g generator) {
		t.Helper()
		if _, err := g.Generate(); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%T accepted a bad config: %v", g, err)
		}
	}
	chat := DefaultChat()
	chat.Turns = Range{3, 2}
	f(chat)
	chat = DefaultChat()
	chat.SessionRate = 0
	f(chat)
	rag := DefaultRAG()
	rag.ZipfS = 1
	f(rag)
	rag = DefaultRAG()
	rag.ChunksPerQuery = rag.CorpusChunks + 1
	f(rag)
	sp := DefaultSharedPrompt()
	sp.UserTokens = Range{0, 10}
	f(sp)
	sp = DefaultSharedPrompt()
	sp.Rate = -1
	f(sp)
}
