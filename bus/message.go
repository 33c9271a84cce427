package bus

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Messages. A message's payload is the protobuf encoding of exactly what
// the subscriber sends over gRPC: one CacheStateUpdate (a ReportCacheState
// stream carrying one update) or one CacheEvent (PublishEvent). The header
// HeaderKind says which; HeaderProducer names the publishing process (a
// random id per subscriber start), for logs and debugging only.
const (
	HeaderKind     = "Inferencecache-Kind"
	HeaderProducer = "Inferencecache-Producer"

	kindUpdate = "update"
	kindEvent  = "event"
)

// MaxMessageBytes bounds a payload the consumer decodes (the gRPC
// server's default receive limit; an update of 4096 entries is ~80 KiB).
const MaxMessageBytes = 8 << 20

// Kind is what a message carries.
type Kind uint8

// Kinds.
const (
	KindUnknown Kind = iota
	KindUpdate       // CacheStateUpdate
	KindEvent        // CacheEvent
)

func (k Kind) String() string {
	switch k {
	case KindUpdate:
		return kindUpdate
	case KindEvent:
		return kindEvent
	}
	return "unknown"
}

// KindOf reads a message's kind from its header.
func KindOf(h nats.Header) Kind {
	switch h.Get(HeaderKind) {
	case kindUpdate:
		return KindUpdate
	case kindEvent:
		return KindEvent
	}
	return KindUnknown
}

// ErrBadMessage wraps every decode failure.
var ErrBadMessage = errors.New("bus: malformed message")

// Message is one message read from the stream.
type Message struct {
	Kind    Kind
	Subject string
	Data    []byte
	// Seq is the stream sequence; Time when the stream stored it.
	Seq  uint64
	Time time.Time
	// pending is how many messages followed this one when NATS delivered it.
	pending uint64
}

// DecodeUpdate decodes an update payload into dst (reset first).
func DecodeUpdate(data []byte, dst *pb.CacheStateUpdate) error {
	if len(data) > MaxMessageBytes {
		return fmt.Errorf("%w: update of %d bytes over %d", ErrBadMessage, len(data), MaxMessageBytes)
	}
	if err := proto.Unmarshal(data, dst); err != nil {
		return fmt.Errorf("%w: update: %w", ErrBadMessage, err)
	}
	return nil
}

// DecodeEvent decodes an event payload into dst (reset first).
func DecodeEvent(data []byte, dst *pb.CacheEvent) error {
	if len(data) > MaxMessageBytes {
		return fmt.Errorf("%w: event of %d bytes over %d", ErrBadMessage, len(data), MaxMessageBytes)
	}
	if err := proto.Unmarshal(data, dst); err != nil {
		return fmt.Errorf("%w: event: %w", ErrBadMessage, err)
	}
	return nil
}
