package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// MooncakeBlockSize is the number of tokens behind each hash id of the
// Mooncake FAST'25 traces.
const MooncakeBlockSize = 512

// maxTraceLine bounds one JSONL line; the longest line of the Mooncake
// conversation trace is a few kilobytes.
const maxTraceLine = 4 << 20

// traceLine is one line of a Mooncake-format trace.
type traceLine struct {
	Timestamp    int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadTrace reads a Mooncake-format JSON Lines trace (kvcache-ai/Mooncake,
// FAST25-release/traces): one object per line with timestamp (ms since the
// trace start), input_length, output_length and hash_ids, where hash_ids
// are prefix block ids of blockSize tokens each. Blank lines are skipped.
//
// Requests come back in file order with ID = their index. Every line must
// satisfy Request.Validate (the last block holds 1..blockSize tokens) and
// timestamps must not decrease; otherwise ReadTrace returns an error that
// wraps ErrInvalid and names the line. limit > 0 stops after that many
// requests.
func ReadTrace(r io.Reader, blockSize, limit int) ([]Request, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: block size %d is not positive", ErrInvalid, blockSize)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var reqs []Request
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if limit > 0 && len(reqs) >= limit {
			break
		}
		var tl traceLine
		if err := json.Unmarshal(line, &tl); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrInvalid, lineNo, err)
		}
		const maxMillis = int64(time.Duration(1<<62) / time.Millisecond)
		if tl.Timestamp < 0 || tl.Timestamp > maxMillis {
			return nil, fmt.Errorf("%w: line %d: timestamp %d out of range", ErrInvalid, lineNo, tl.Timestamp)
		}
		req := Request{
			ID:           len(reqs),
			Arrival:      time.Duration(tl.Timestamp) * time.Millisecond,
			Blocks:       tl.HashIDs,
			BlockSize:    blockSize,
			InputTokens:  tl.InputLength,
			OutputTokens: tl.OutputLength,
		}
		if err := req.Validate(); err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		if n := len(reqs); n > 0 && req.Arrival < reqs[n-1].Arrival {
			return nil, fmt.Errorf("%w: line %d: timestamp %d is before the previous line's", ErrInvalid, lineNo, tl.Timestamp)
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	return reqs, nil
}

// LoadTrace opens path and reads it with ReadTrace.
func LoadTrace(path string, blockSize, limit int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open trace: %w", err)
	}
	defer f.Close()
	reqs, err := ReadTrace(f, blockSize, limit)
	if err != nil {
		return nil, fmt.Errorf("cannot load trace %s: %w", path, err)
	}
	return reqs, nil
}

// WriteTrace writes reqs in the Mooncake JSON Lines format that ReadTrace
// reads, with arrivals truncated to whole milliseconds. Block sizes are not
// recorded; the reader supplies one. The output is byte-for-byte
// deterministic for the same requests.
func WriteTrace(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	var buf []byte
	for i := range reqs {
		r := &reqs[i]
		buf = append(buf[:0], `{"timestamp": `...)
		buf = strconv.AppendInt(buf, int64(r.Arrival/time.Millisecond), 10)
		buf = append(buf, `, "input_length": `...)
		buf = strconv.AppendInt(buf, int64(r.InputTokens), 10)
		buf = append(buf, `, "output_length": `...)
		buf = strconv.AppendInt(buf, int64(r.OutputTokens), 10)
		buf = append(buf, `, "hash_ids": [`...)
		for j, id := range r.Blocks {
			if j > 0 {
				buf = append(buf, ", "...)
			}
			buf = strconv.AppendUint(buf, id, 10)
		}
		buf = append(buf, "]}\n"...)
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("cannot write trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cannot write trace: %w", err)
	}
	return nil
}
