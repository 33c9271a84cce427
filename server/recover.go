package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// Panic recovery. A handler panic must cost one request, not the process:
// gRPC does not recover handler panics at all (the process dies), and
// net/http recovers them by cutting the connection without an answer or a
// metric. Every gRPC call and every HTTP request runs under these instead:
// the request is answered Internal (gRPC) or 500 (HTTP), the listener's
// recovered_panics_total moves, and the panic value and stack are logged at
// ERROR.
//
// A recovered panic leaves whatever the handler was changing as it was. The
// lookup path only reads; a panic while the index writer lock is held would
// leave that lock held, and ingest would stop (lookups keep answering).

// errInternal is the status of a call whose handler panicked. It does not
// carry the panic value: that may hold request data or internals.
var errInternal = status.Error(codes.Internal, "internal error: the handler failed; the server logged the details")

// recovered counts and logs a recovered panic. A client that hits a bug
// can repeat it, so the log is rate-limited per listener (panicLogs): a
// burst of 5, then one line per 10 s, each counting those held back; the
// counter counts every one.
func (s *Server) recovered(listener, what string, p any) {
	s.metrics.RecoveredPanic(listener)
	lim := s.panicLogs[listener]
	if lim == nil {
		lim = s.panicLogs[servermetrics.ListenerGRPC]
	}
	if n, ok := lim.Allow(); ok {
		s.log.Error("recovered a panic in a handler; the request failed, the server goes on",
			"listener", listener, "handler", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()), ratelog.SuppressedKey, n)
	}
}

// newPanicLogs builds the per-listener panic log limiters (Server.panicLogs).
func newPanicLogs() map[string]*ratelog.Limiter {
	m := map[string]*ratelog.Limiter{}
	for _, l := range []string{servermetrics.ListenerGRPC, servermetrics.ListenerHTTP, servermetrics.ListenerControl} {
		m[l] = ratelog.New(5, 10*time.Second)
	}
	return m
}

// recoverUnary is the outermost unary interceptor.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered(servermetrics.ListenerGRPC, info.FullMethod, p)
			resp, err = nil, errInternal
		}
	}()
	return handler(ctx, req)
}

// recoverStream is the outermost stream interceptor.
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered(servermetrics.ListenerGRPC, info.FullMethod, p)
			err = errInternal
		}
	}()
	return handler(srv, ss)
}

// recoverHTTP wraps one HTTP listener's handler. A panic before anything
// was written answers 500; after the header is out the status cannot change,
// so the connection is cut (http.ErrAbortHandler) and the client sees a
// broken response rather than a complete-looking one. http.ErrAbortHandler
// itself is a deliberate abort, passed on untouched.
func (s *Server) recoverHTTP(listener string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(p)
			}
			s.recovered(listener, r.Method+" "+clipPath(r.URL.Path), p)
			if tw.wrote {
				panic(http.ErrAbortHandler)
			}
			http.Error(w, "internal server error", http.StatusInternalServerError)
		}()
		h.ServeHTTP(tw, r)
	})
}

// maxLoggedPath bounds the request path quoted in the panic log.
const maxLoggedPath = 256

func clipPath(p string) string {
	if len(p) > maxLoggedPath {
		return p[:maxLoggedPath] + "..."
	}
	return p
}

// trackingWriter records whether the handler wrote the header (or body).
// It is used by one handler goroutine.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackingWriter) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher when the underlying writer does.
func (w *trackingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		w.wrote = true
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
