package server_test

import (
	"errors"
	"math"
	"testing"

	"github.com/inferencecache/inferencecache/server"
)

// TestLoadConfigRejected: out-of-range load-aware routing knobs are
// refused at startup with ErrInvalidConfig (a NaN --load-bound used to
// pass and switch overload detection off), and load-aware routing off
// skips the checks.
func TestLoadConfigRejected(t *testing.T) {
	for name, mut := range map[string]func(*server.Config){
		"NaN bound":       func(c *server.Config) { c.Load.Bound = math.NaN() },
		"bound below 1":   func(c *server.Config) { c.Load.Bound = 0.5 },
		"infinite weight": func(c *server.Config) { c.Load.PrefillWeight = math.Inf(1) },
		"weight below 1":  func(c *server.Config) { c.Load.PrefillWeight = 0 },
		"min queue 0":     func(c *server.Config) { c.Load.MinQueue = 0 },
		"min match 2":     func(c *server.Config) { c.Load.MinMatch = 2 },
		"NaN min match":   func(c *server.Config) { c.Load.MinMatch = math.NaN() },
		"max age 0":       func(c *server.Config) { c.Load.MaxAge = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			mut(&cfg)
			if _, err := server.New(cfg); !errors.Is(err, server.ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
			cfg.Load.Enabled = false
			if _, err := server.New(cfg); err != nil {
				t.Fatalf("with load-aware routing off: %v", err)
			}
		})
	}
}
