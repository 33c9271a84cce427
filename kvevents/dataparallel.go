package kvevents

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// A data-parallel engine runs DataParallel.Size ranks, each with its own
// scheduler and KV cache, so each is a replica of its own for routing.
// vLLM and SGLang create rank r's event publisher on the configured
// endpoints offset by r: a tcp port plus r (tcp://*:5557 → :5557+r, the
// replay endpoint likewise), an inproc or ipc name suffixed _dp<r>. Both
// export every rank's metrics on one /metrics, each series labelled with
// its rank: vLLM `engine="<r>"`, SGLang `dp_rank="<r>"`.

// Default rank labels of the engines' per-rank metrics.
const (
	RankLabelVLLM   = "engine"
	RankLabelSGLang = "dp_rank"
)

// DataParallel says which ranks of a data-parallel engine a subscriber
// process follows (cmd/kvevent-subscriber's --data-parallel-* flags).
type DataParallel struct {
	// Size is the engine's number of data-parallel ranks; 1 (or 0) means
	// no data parallelism: one replica, endpoints and ids as given.
	Size int
	// Rank, when >= 0, follows only that rank (one subscriber process per
	// rank); -1 follows every rank 0..Size-1 in this process.
	Rank int
	// RankLabel is the metrics label holding the rank; "" means the
	// engine's (DefaultRankLabel of the hash scheme).
	RankLabel string
}

// DefaultRankLabel is the label an engine puts its data-parallel rank in,
// by hash scheme.
func DefaultRankLabel(hashScheme string) string {
	if hashScheme == "sglang" {
		return RankLabelSGLang
	}
	return RankLabelVLLM
}

// Validate checks the flags' combination.
func (d DataParallel) Validate() error {
	switch {
	case d.Size < 0:
		return fmt.Errorf("--data-parallel-size %d must be at least 1", d.Size)
	case d.Rank < -1:
		return fmt.Errorf("--data-parallel-rank %d must be a rank or -1 (every rank)", d.Rank)
	case d.Rank >= max(d.Size, 1):
		return fmt.Errorf("--data-parallel-rank %d is not below --data-parallel-size %d", d.Rank, max(d.Size, 1))
	}
	return nil
}

// Ranks returns the ranks this process follows.
func (d DataParallel) Ranks() []int {
	if d.Rank >= 0 {
		return []int{d.Rank}
	}
	out := make([]int, max(d.Size, 1))
	for i := range out {
		out[i] = i
	}
	return out
}

// Config returns base adapted to rank: with Size > 1 the engine endpoints
// are rank's (RankEndpoint), the replica id is <replica>-dp<rank> (the
// replica-id rule the endpoint picker relies on: a single rank reports the
// pod name, rank r of several reports <pod>-dp<r>), the state file is
// <file>.dp<rank>, and stats are taken from the series labelled with the
// rank. With Size <= 1, base is returned as is.
func (d DataParallel) Config(base Config, rank int) (Config, error) {
	if d.Size <= 1 {
		return base, nil
	}
	if rank < 0 || rank >= d.Size {
		return Config{}, fmt.Errorf("rank %d is not below the data-parallel size %d", rank, d.Size)
	}
	c := base
	var err error
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.Endpoint, err = RankEndpoint(c.Endpoint, rank); err != nil {
		return Config{}, err
	}
	if c.ReplayEndpoint != "" {
		if c.ReplayEndpoint, err = RankEndpoint(c.ReplayEndpoint, rank); err != nil {
			return Config{}, err
		}
	}
	c.ReplicaID = RankReplicaID(base.ReplicaID, rank, d.Size)
	if c.StateFile != "" {
		c.StateFile = fmt.Sprintf("%s.dp%d", c.StateFile, rank)
	}
	c.MetricsRankLabel = d.RankLabel
	if c.MetricsRankLabel == "" {
		c.MetricsRankLabel = DefaultRankLabel(c.HashScheme)
	}
	c.MetricsRank = strconv.Itoa(rank)
	return c, nil
}

// RankReplicaID is the replica id rank reports: base with one rank,
// <base>-dp<rank> with several.
func RankReplicaID(base string, rank, size int) string {
	if size <= 1 {
		return base
	}
	return fmt.Sprintf("%s-dp%d", base, rank)
}

// RankEndpoint is the endpoint rank of a data-parallel engine publishes on,
// given the configured one: rank 0 uses it as is; tcp://host:port becomes
// tcp://host:port+rank; inproc:// and ipc:// names get the suffix _dp<rank>.
func RankEndpoint(ep string, rank int) (string, error) {
	if rank == 0 {
		return ep, nil
	}
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "", fmt.Errorf("cannot offset endpoint %q for rank %d: no scheme", ep, rank)
	}
	switch scheme {
	case "inproc", "ipc":
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", fmt.Errorf("cannot offset endpoint %q for rank %d: %w", ep, rank, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p <= 0 {
			return "", fmt.Errorf("cannot offset endpoint %q for rank %d: port %q", ep, rank, port)
		}
		if p+rank > 65535 {
			return "", fmt.Errorf("cannot offset endpoint %q for rank %d: port %d is over 65535", ep, rank, p+rank)
		}
		return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
	}
	return "", fmt.Errorf("cannot offset endpoint %q for rank %d: scheme %q", ep, rank, scheme)
}
