package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Replay errors; Replay wraps one of them.
var (
	// ErrReplayUnavailable: the replay endpoint could not be reached.
	ErrReplayUnavailable = errors.New("kvevents: replay endpoint unavailable")
	// ErrReplayTimeout: no end marker arrived before the deadline.
	ErrReplayTimeout = errors.New("kvevents: replay timed out")
	// ErrReplayProtocol: the reply did not follow the replay protocol.
	ErrReplayProtocol = errors.New("kvevents: malformed replay reply")
)

// zmqLogger keeps zmq4's connection-churn logging out of our logs.
var zmqLogger = log.New(io.Discard, "", 0)

// Replay asks an engine's replay ROUTER for every batch from start on. It
// sends the 8-byte big-endian start sequence (after an empty delimiter
// frame, as a REQ socket would), then calls fn for each (seq, payload)
// reply in order until the end marker (seq -1). fn's error stops the
// replay and is returned. ctx bounds the whole exchange; without a
// deadline in ctx, Replay uses one of 5 s.
func Replay(ctx context.Context, endpoint string, start uint64, fn func(seq uint64, payload []byte) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	refusal := &frameRefusal{}
	sock := zmq4.NewDealer(withFrameRefusal(ctx, refusal),
		zmq4.WithLogger(zmqLogger),
		zmq4.WithDialerMaxRetries(2),
		zmq4.WithDialerRetry(100*time.Millisecond),
		zmq4.WithDialerTimeout(time.Second))
	defer sock.Close()
	if err := sock.Dial(limitedEndpoint(endpoint)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrReplayUnavailable, endpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		if r := refusal.Err(); r != nil {
			err = r // the reason zmq4's connection closed
		}
		return replayErr(ctx, fmt.Errorf("%w: cannot send request: %w", ErrReplayUnavailable, err))
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if r := refusal.Err(); r != nil {
				err = r
			}
			return replayErr(ctx, fmt.Errorf("%w: %w", ErrReplayUnavailable, err))
		}
		frames := msg.Frames
		for len(frames) > 0 && len(frames[0]) == 0 { // delimiter
			frames = frames[1:]
		}
		if len(frames) == 0 || len(frames[0]) != 8 {
			return fmt.Errorf("%w: %d frames", ErrReplayProtocol, len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(frames[0])
		if int64(seq) == -1 {
			return nil
		}
		if len(frames) < 2 {
			return fmt.Errorf("%w: batch %d without payload", ErrReplayProtocol, seq)
		}
		if err := fn(seq, frames[len(frames)-1]); err != nil {
			return err
		}
	}
}

func replayErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v", ErrReplayTimeout, err)
	}
	return err
}
