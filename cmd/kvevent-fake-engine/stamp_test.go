package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// TestRunStampsBatchesNow: the command feeds a real subscriber and server,
// which age entries by the batch timestamp, so its batches are stamped with
// the current time, whatever the workload.
func TestRunStampsBatchesNow(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "synthetic", "--turns", "5", "--interval", "1ms"},
		{"--workload", "mooncake", "--trace", "../../bench/workload/testdata/sample_trace.jsonl", "--trace-limit", "5", "--speedup", "1000"},
	} {
		t.Run(args[1], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ep := "tcp://" + freeAddr(t)
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			if err := sub.SetOption(zmq4.OptionSubscribe, "kv-events"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- run(append(args, "--endpoint", ep, "--replay-endpoint", "", "--wait-subscriber", "20s", "--duration", "25s"))
			}()
			if err := dialRetry(ctx, sub, ep); err != nil {
				t.Fatal(err)
			}
			msg, err := sub.Recv()
			if err != nil {
				t.Fatalf("no batch: %v", err)
			}
			_, _, payload, err := wire.ParseMessage(msg.Frames)
			if err != nil {
				t.Fatal(err)
			}
			var b wire.Batch
			if err := wire.NewDecoder().Decode(payload, &b); err != nil {
				t.Fatal(err)
			}
			if age := time.Since(time.UnixMicro(kvevents.TimestampUS(b.TS))); math.Abs(age.Seconds()) > 60 {
				t.Fatalf("first batch stamped %v ago, want about now", age.Round(time.Second))
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("run did not return")
			}
		})
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// dialRetry dials ep until the command has bound it, or ctx ends.
func dialRetry(ctx context.Context, s zmq4.Socket, ep string) error {
	for {
		err := s.Dial(ep)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cannot dial %s: %w", ep, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
