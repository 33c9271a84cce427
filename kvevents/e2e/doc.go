// Package e2e holds end-to-end tests of restart handling with the built
// binaries (cmd/server, cmd/kvevent-subscriber, cmd/kvevent-fake-engine)
// running as separate processes on 127.0.0.1 and killed with SIGKILL. The
// package holds only tests; see restart_test.go.
package e2e
