package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServerProcExitReportsLogTail: a server that exits before serving is
// reported with the last lines of its log, all of them: the process is
// reaped only after its stderr was read to the end.
func TestServerProcExitReportsLogTail(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "server")
	script := "#!/bin/sh\necho 'starting' >&2\necho 'fatal: cannot bind 127.0.0.1:9090' >&2\nexit 3\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		_, err := startServerProc(bin, nil)
		if err == nil {
			t.Fatal("a server that exits was reported as serving")
		}
		if !strings.Contains(err.Error(), "fatal: cannot bind") || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("error lacks the server's last log line or its exit status: %v", err)
		}
	}
}
