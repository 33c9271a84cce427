package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/policy"
)

// ErrEmptyToken is returned when a token file exists but holds no token.
var ErrEmptyToken = errors.New("controller: bearer token file is empty")

// maxSnapshotBytes caps a /snapshot response the controller will decode.
const maxSnapshotBytes = 64 << 20

// ServerClient calls the routing server's internal :8081 endpoints.
//
// Every request re-reads its bearer token from disk: projected ServiceAccount
// tokens are rotated by the kubelet, so a token cached at startup would
// expire. /policy uses the policy-audience token, /snapshot the
// controller-audience one. An empty path sends no Authorization header (for
// a server run with its auth disabled).
//
// A ServerClient is safe for concurrent use; its fields must not change
// after first use.
type ServerClient struct {
	// BaseURL is the server's internal address, e.g. http://server:8081.
	BaseURL string
	// PolicyTokenPath is the file of the inferencecache.io/policy token.
	PolicyTokenPath string
	// ControllerTokenPath is the file of the inferencecache.io/controller token.
	ControllerTokenPath string
	// HTTP is the client used; nil means one with a 10 s timeout.
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

func (c *ServerClient) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// PushPolicy POSTs the full replace-on-write policy body to /policy at
// BaseURL. Any status outside 2xx is an error that carries the server's
// message.
func (c *ServerClient) PushPolicy(ctx context.Context, b *policy.Body) error {
	raw, err := encodePolicy(b)
	if err != nil {
		return err
	}
	return c.PushPolicyTo(ctx, c.BaseURL, raw)
}

// encodePolicy is the JSON of a /policy body, encoded once per pass and
// pushed to every server.
func encodePolicy(b *policy.Body) ([]byte, error) {
	raw, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("cannot encode policy body: %w", err)
	}
	return raw, nil
}

// PushPolicyTo POSTs raw, an encoded policy body, to /policy at base (a
// server pod's address, e.g. http://10.0.0.7:8081), with the policy-audience
// token. Any status outside 2xx is an error that carries the server's
// message.
func (c *ServerClient) PushPolicyTo(ctx context.Context, base string, raw []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, joinURL(base, "/policy"), bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("cannot build /policy request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := authorize(req, c.PolicyTokenPath); err != nil {
		return err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("cannot push policy to %s: %w", base, err)
	}
	defer drain(resp.Body)
	if resp.StatusCode/100 != 2 {
		return &PushError{Server: base, Code: resp.StatusCode, Text: statusText(resp)}
	}
	return nil
}

// PushError is a /policy answer outside 2xx.
type PushError struct {
	// Server is the base URL pushed to.
	Server string
	// Code is the HTTP status; Text is it with the server's message.
	Code int
	Text string
}

func (e *PushError) Error() string {
	return fmt.Sprintf("cannot push policy to %s: %s", e.Server, e.Text)
}

// refusedBody reports whether err is the server refusing the body itself
// (HTTP 400), as a server that predates version 8 refuses a version-8 body.
func refusedBody(err error) bool {
	var pe *PushError
	return errors.As(err, &pe) && pe.Code == http.StatusBadRequest
}

// Snapshot GETs the server's /snapshot aggregate.
func (c *ServerClient) Snapshot(ctx context.Context) (controlapi.CacheSnapshot, error) {
	var snap controlapi.CacheSnapshot
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/snapshot"), nil)
	if err != nil {
		return snap, fmt.Errorf("cannot build /snapshot request: %w", err)
	}
	if err := authorize(req, c.ControllerTokenPath); err != nil {
		return snap, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return snap, fmt.Errorf("cannot read snapshot from %s: %w", c.BaseURL, err)
	}
	defer drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return snap, fmt.Errorf("cannot read snapshot from %s: %s", c.BaseURL, statusText(resp))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxSnapshotBytes)).Decode(&snap); err != nil {
		return snap, fmt.Errorf("cannot decode snapshot from %s: %w", c.BaseURL, err)
	}
	return snap, nil
}

func (c *ServerClient) url(path string) string { return joinURL(c.BaseURL, path) }

func joinURL(base, path string) string { return strings.TrimSuffix(base, "/") + path }

// authorize sets the bearer token read from path now; "" sends none.
func authorize(req *http.Request, path string) error {
	if path == "" {
		return nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("cannot read bearer token for %s: %w", req.URL.Path, err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return fmt.Errorf("%w: %s", ErrEmptyToken, path)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return nil
}

func statusText(resp *http.Response) string {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if s := strings.TrimSpace(string(msg)); s != "" {
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, s)
	}
	return fmt.Sprintf("HTTP %d", resp.StatusCode)
}

// drain reads what is left of a body (bounded) so the connection is reused.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 1<<20))
	_ = body.Close()
}
