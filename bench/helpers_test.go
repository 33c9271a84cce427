package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// repoRoot walks up from the test's working directory to the directory
// holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	t.Fatal("cannot find the repository root (go.mod) above the test directory")
	return ""
}

// sharedTrace returns the path of the shared Mooncake conversation trace,
// which lives outside the repository at ../shared relative to its root
// (developers' machines and CI both have it). Locally a missing file skips
// the test; under CI=true it fails it.
func sharedTrace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(repoRoot(t), "..", "shared", "traces", "mooncake_conversation_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("shared Mooncake trace missing under CI: %v", err)
		}
		t.Skipf("shared Mooncake trace not available: %v", err)
	}
	return path
}
