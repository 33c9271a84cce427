package bus

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// Connection defaults: reconnect forever, every 250 ms (jittered), also
// when the first connect fails (a process may start before NATS); pings
// every 10 s so a peer that vanished without closing the connection is
// noticed within ~30 s. Publishing while disconnected fails at once (no
// reconnect buffer): the forwarder's own bounded buffer holds the work.
const (
	reconnectWait   = 250 * time.Millisecond
	reconnectJitter = 100 * time.Millisecond
	pingInterval    = 10 * time.Second
)

// Connect returns a connection to url that reconnects by itself; it does
// not wait for the first connect. name identifies the client to NATS.
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitter),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(-1),
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(2),
		nats.ConnectHandler(func(c *nats.Conn) { log.Info("connected to NATS", "url", c.ConnectedUrlRedacted()) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("reconnected to NATS", "url", c.ConnectedUrlRedacted()) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("disconnected from NATS", "err", err) }),
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}
