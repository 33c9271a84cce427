// Package workload generates and reads the request streams that drive the
// cluster simulator in package bench and, later, the gRPC load generator.
//
// A Request is a prompt described only by its KV-block chain: block ids
// that name a block together with everything before it (prefix ids, as in
// the Mooncake traces and in engine block hashes), the number of tokens in
// a full block, and the prompt and output token counts. Two requests can
// reuse KV for exactly their common leading run of block ids.
//
// Every generator here is deterministic: the same configuration and seed
// give the same requests, in the same order, on every run and platform.
// Generators and readers return fresh slices that the caller owns; the
// package keeps no global state and is safe for concurrent use.
//
// This package imports nothing of the simulator, so load generators can
// reuse it without pulling in package bench.
package workload

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalid is wrapped by every error that reports a malformed request,
// trace line or generator configuration.
var ErrInvalid = errors.New("workload: invalid input")

// Request is one prompt of a workload.
//
// Blocks[i] is the prefix id of block i: it stands for block i and every
// token before it. Every block holds BlockSize tokens except the last one,
// which holds InputTokens - BlockSize*(len(Blocks)-1) tokens (1..BlockSize):
// a prompt whose length is not a multiple of BlockSize ends in a partial
// block. A Request is a value; its Blocks slice must be treated as
// read-only once the request is handed to a consumer, because simulators
// and events share it.
type Request struct {
	// ID is the request's position in its workload (0, 1, 2, ...).
	ID int
	// Arrival is the time the request arrives, relative to the start of
	// the workload.
	Arrival time.Duration
	// Blocks is the prefix block chain of the prompt, first block first.
	Blocks []uint64
	// BlockSize is the number of tokens in a full block.
	BlockSize int
	// InputTokens is the prompt length in tokens.
	InputTokens int
	// OutputTokens is the number of tokens the request generates.
	OutputTokens int
}

// BlockTokens returns the number of prompt tokens in block i, which is
// BlockSize for every block but a partial last one.
func (r *Request) BlockTokens(i int) int {
	if i < len(r.Blocks)-1 {
		return r.BlockSize
	}
	return r.InputTokens - r.BlockSize*(len(r.Blocks)-1)
}

// PrefixTokens returns the number of prompt tokens in the first n blocks.
// n is clamped to [0, len(Blocks)].
func (r *Request) PrefixTokens(n int) int {
	switch {
	case n <= 0:
		return 0
	case n >= len(r.Blocks):
		return r.InputTokens
	default:
		return n * r.BlockSize
	}
}

// Validate reports whether r is well formed: a positive block size, at
// least one block, an input length that fills every block but the last
// and puts 1..BlockSize tokens in the last, and a non-negative arrival and
// output length.
func (r *Request) Validate() error {
	n := len(r.Blocks)
	switch {
	case r.BlockSize <= 0:
		return fmt.Errorf("%w: request %d: block size %d is not positive", ErrInvalid, r.ID, r.BlockSize)
	case n == 0:
		return fmt.Errorf("%w: request %d: no blocks", ErrInvalid, r.ID)
	case r.InputTokens <= (n-1)*r.BlockSize || r.InputTokens > n*r.BlockSize:
		return fmt.Errorf("%w: request %d: %d input tokens do not fill %d blocks of %d tokens",
			ErrInvalid, r.ID, r.InputTokens, n, r.BlockSize)
	case r.OutputTokens < 0:
		return fmt.Errorf("%w: request %d: negative output length %d", ErrInvalid, r.ID, r.OutputTokens)
	case r.Arrival < 0:
		return fmt.Errorf("%w: request %d: negative arrival %v", ErrInvalid, r.ID, r.Arrival)
	}
	return nil
}

// ValidateStream validates every request and checks that arrivals never
// decrease, which is the order simulators consume requests in.
func ValidateStream(reqs []Request) error {
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			return err
		}
		if i > 0 && reqs[i].Arrival < reqs[i-1].Arrival {
			return fmt.Errorf("%w: request %d arrives at %v, before request %d at %v",
				ErrInvalid, reqs[i].ID, reqs[i].Arrival, reqs[i-1].ID, reqs[i-1].Arrival)
		}
	}
	return nil
}
