package server

import "net/http"

// SetWrapHTTP sets the test seam that wraps each HTTP listener's handler
// inside the panic recovery: listener is "http" (public) or "control".
func SetWrapHTTP(c *Config, wrap func(listener string, h http.Handler) http.Handler) {
	c.wrapHTTP = wrap
}
