package rulestest

import (
	"os"
	"testing"

	"github.com/inferencecache/inferencecache/bus/bustest"
)

// TestMain runs the tests through bustest.Main, which builds the NATS
// server their tests start as a process.
func TestMain(m *testing.M) { os.Exit(bustest.Main(m)) }
