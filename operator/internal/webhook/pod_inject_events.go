package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The sidecar is wired to the engine's effective --kv-events-config: the
// webhook's own (kvEventsConfig), one from engineOverrides, or the pod's own,
// which wins over both. vLLM and SGLang decide from the endpoint string which
// side binds the PUB socket (ZmqEventPublisher._socket_setup): an endpoint
// with "*" or "::", or an ipc:// or inproc:// one, they bind; any other they
// connect to. The sidecar does the opposite: it connects (on loopback) to an
// engine that binds, and binds an engine's loopback endpoint that the engine
// connects to. So a pod that keeps vLLM's usual tcp://*:5557 still works, and
// never has the sidecar bind a port its engine binds too.

// eventsWiring is how the sidecar reaches the engine's KV events.
type eventsWiring struct {
	// endpoint is rank 0's publisher endpoint as the sidecar is given it.
	endpoint string
	// bind says the engine connects its PUB: the sidecar binds endpoint
	// (--engine-endpoint-mode=bind).
	bind bool
	// replay is rank 0's replay endpoint the sidecar dials; "" when the
	// engine serves none (gaps then reset the replica).
	replay string
	topic  string
}

// vLLM's and SGLang's KVEventsConfig defaults for the fields the sidecar
// needs.
const (
	engineDefaultEndpoint = "tcp://*:5557"
	engineDefaultTopic    = ""
)

// errNoEventsConfig: the engine container has no --kv-events-config (the
// webhook's was suppressed and the pod sets none): it publishes nothing.
var errNoEventsConfig = errors.New("the engine container has no --kv-events-config, so its engine publishes no KV events")

// engineEvents reads the engine container c's --kv-events-config (in its
// command or args, as --kv-events-config=JSON or --kv-events-config JSON;
// the last one, as the engines' argument parsers take it) and says how the
// sidecar reaches what it configures. An error says why it cannot.
func engineEvents(c *corev1.Container) (eventsWiring, error) {
	raw, found := "", false
	argv := slices.Concat(c.Command, c.Args)
	for i, a := range argv {
		name, value, inline := strings.Cut(a, "=")
		if name != "--kv-events-config" {
			continue
		}
		if !inline {
			if i+1 >= len(argv) {
				continue
			}
			value = argv[i+1]
		}
		raw, found = value, true
	}
	if !found {
		return eventsWiring{}, errNoEventsConfig
	}
	var cfg struct {
		Endpoint       *string `json:"endpoint"`
		ReplayEndpoint *string `json:"replay_endpoint"`
		Topic          *string `json:"topic"`
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return eventsWiring{}, fmt.Errorf("cannot parse the engine's --kv-events-config: %w", err)
	}
	w := eventsWiring{endpoint: engineDefaultEndpoint, topic: engineDefaultTopic}
	if cfg.Endpoint != nil {
		w.endpoint = *cfg.Endpoint
	}
	if cfg.Topic != nil {
		w.topic = *cfg.Topic
	}
	ep := w.endpoint
	switch {
	case strings.HasPrefix(ep, "ipc://"), strings.HasPrefix(ep, "inproc://"):
		return eventsWiring{}, fmt.Errorf("the engine publishes its KV events on %q, which the sidecar cannot reach (use a tcp endpoint)", ep)
	case engineBinds(ep):
		// The engine binds: on every interface the sidecar connects on
		// loopback, on one address ([::1]) there.
		host, port, err := splitTCP(ep)
		if err != nil {
			return eventsWiring{}, err
		}
		if everyInterface(host) {
			w.endpoint = loopbackTCP(port)
		}
	default:
		// The engine connects: the sidecar must bind that address, which
		// it does on loopback only.
		if err := loopbackIPv4Endpoint(ep); err != nil {
			return eventsWiring{}, fmt.Errorf("the engine connects its KV-event publisher to %q, which the sidecar cannot bind: %w", ep, err)
		}
		w.bind = true
	}
	if cfg.ReplayEndpoint != nil && *cfg.ReplayEndpoint != "" {
		r := *cfg.ReplayEndpoint
		if !strings.HasPrefix(r, "tcp://") {
			return eventsWiring{}, fmt.Errorf("the engine serves replays on %q, which the sidecar cannot reach (use a tcp endpoint)", r)
		}
		host, port, err := splitTCP(r)
		if err != nil {
			return eventsWiring{}, err
		}
		if everyInterface(host) || host == "0.0.0.0" {
			// Bound on every interface: the sidecar asks on loopback.
			r = loopbackTCP(port)
		}
		w.replay = r
	}
	return w, nil
}

// engineBinds is the engines' rule: they bind the PUB socket for an
// endpoint with a wildcard (or ipc/inproc) and connect it otherwise.
func engineBinds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// splitTCP splits tcp://host:port at the last colon, as the engines do
// when they offset a port by the data-parallel rank.
func splitTCP(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	i := strings.LastIndex(rest, ":")
	if !ok || i < 0 {
		return "", 0, fmt.Errorf("cannot read the port of the engine endpoint %q", ep)
	}
	port, err = strconv.Atoi(rest[i+1:])
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("cannot read the port of the engine endpoint %q", ep)
	}
	return rest[:i], port, nil
}

// everyInterface says an engine endpoint's host binds every interface.
func everyInterface(host string) bool { return host == "*" || host == "[::]" }

// loopbackIPv4Endpoint accepts tcp://<IPv4 loopback>:<port>, the endpoints
// the sidecar binds (kvevents.EndpointBind).
func loopbackIPv4Endpoint(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return errors.New("not a tcp endpoint")
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil || !ap.Addr().Is4() || !ap.Addr().IsLoopback() || ap.Port() == 0 {
		return errors.New("not an IPv4 loopback address with a port")
	}
	return nil
}
