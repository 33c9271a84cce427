//go:build !linux

package bustest

import "syscall"

// childAttr: only Linux can tie the server's life to the test process.
func childAttr() *syscall.SysProcAttr { return nil }
