package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream defaults.
const (
	// DefaultStream names the one stream (--nats-stream).
	DefaultStream = "INFERENCECACHE"
	// DefaultMaxTTL is the server's default entry TTL (contract §3.2).
	DefaultMaxTTL = 30 * time.Minute
	// DefaultRefresh is the subscriber's default refresh interval
	// (kvevents.DefaultRefreshInterval).
	DefaultRefresh = 5 * time.Minute
	// DefaultMaxBytes bounds the stream's storage (--nats-stream-max-bytes):
	// far above the replay window of the deployments docs/scaleout.md sizes
	// (~3 MB per replica holding 20 k blocks), so the age bound is the one
	// that acts; it keeps a runaway producer from filling NATS's disk.
	DefaultMaxBytes = 1 << 30
)

// Retention is the stream's MaxAge for the longest tenant TTL and the
// subscribers' refresh interval: the window a restarted server replays.
//
// Every report a running server can still match is younger than the TTL
// (the server stamps it no later than NATS stores it, and a report whose
// stamp is older than the TTL never matches), so a window of the TTL holds
// every live report, and every held block was re-reported within the last
// refresh interval. The refresh interval on top is the margin for a refresh
// walk that overruns its interval, a producer clock behind the NATS server's
// and publishes retried after an outage; it costs interval/TTL more storage
// (1/6 at the defaults). Messages older than the window only describe
// entries that have aged out anyway.
func Retention(maxTTL, refresh time.Duration) time.Duration { return maxTTL + refresh }

// StreamConfig describes the stream.
type StreamConfig struct {
	// Name is the stream's name and its subjects' first token.
	Name string
	// MaxAge is the retention (Retention); 0 means
	// Retention(DefaultMaxTTL, DefaultRefresh).
	MaxAge time.Duration
	// MaxBytes bounds the stream's storage; 0 means DefaultMaxBytes. At
	// the bound, as at the age bound, the oldest messages are discarded
	// first, which shortens the window a new server replays (see
	// docs/scaleout.md, "Retention").
	MaxBytes int64
	// Replicas is the stream's replication in a NATS cluster (1 to 5);
	// 0 means 1.
	Replicas int
	// Memory stores the stream in memory instead of files (tests).
	Memory bool
}

// Validate checks c and fills its defaults.
func (c *StreamConfig) Validate() error {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if !ValidStreamName(c.Name) {
		return fmt.Errorf("bus: stream name %q: want 1 to 64 of [A-Za-z0-9_-]", c.Name)
	}
	if c.MaxAge == 0 {
		c.MaxAge = Retention(DefaultMaxTTL, DefaultRefresh)
	}
	if c.MaxAge < 0 {
		return fmt.Errorf("bus: negative stream max age %v", c.MaxAge)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxBytes < 0 {
		return fmt.Errorf("bus: negative stream max bytes %d", c.MaxBytes)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("bus: stream replicas %d: want 1 to 5", c.Replicas)
	}
	return nil
}

func (c StreamConfig) jetstream() jetstream.StreamConfig {
	st := jetstream.FileStorage
	if c.Memory {
		st = jetstream.MemoryStorage
	}
	return jetstream.StreamConfig{
		Name:        c.Name,
		Description: "inferencecache producer reports (see docs/scaleout.md)",
		Subjects:    []string{StreamSubjects(c.Name)},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.MaxAge,
		MaxBytes:    c.MaxBytes,
		Storage:     st,
		Replicas:    c.Replicas,
		MaxMsgSize:  MaxMessageBytes,
	}
}

// EnsureStream creates the stream, or with update makes an existing one's
// configuration c's (the subscriber, which owns the retention, updates; a
// server only creates a missing one). Bounded by ctx.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig, update bool) (jetstream.Stream, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if update {
		s, err := js.CreateOrUpdateStream(ctx, c.jetstream())
		if err != nil {
			return nil, fmt.Errorf("cannot create or update stream %s: %w", c.Name, err)
		}
		return s, nil
	}
	s, err := js.Stream(ctx, c.Name)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("cannot look up stream %s: %w", c.Name, err)
	}
	s, err = js.CreateStream(ctx, c.jetstream())
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.Stream(ctx, c.Name) // created meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("cannot create stream %s: %w", c.Name, err)
	}
	return s, nil
}
