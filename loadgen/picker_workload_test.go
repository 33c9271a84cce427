package loadgen

import (
	"sync"
	"testing"
)

// More workers than conversations: a conversation that sent its last turn
// is never handed out again while its replacement is being built (which
// read past its exchanges and panicked), and every turn is in range.
func TestPickerWorkloadConcurrentNext(t *testing.T) {
	cfg := &PickerConfig{Conversations: 2, Turns: 3, PromptTokens: 64, TurnTokens: 8, Seed: 1}
	w := newPickerWorkload(cfg)
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for range 16 {
		wg.Go(func() {
			var body []byte
			for range 500 {
				c, turn := w.next()
				if turn < 0 || turn >= cfg.Turns || turn > len(c.exchanges) {
					errs <- "turn out of range"
					return
				}
				body = c.body(body[:0], turn)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
