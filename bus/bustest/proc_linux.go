package bustest

import "syscall"

// childAttr makes the kernel kill the server if the test process dies
// first (a timed-out or killed test run leaves no server behind).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
