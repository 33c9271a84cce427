package doctor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/controlapi"
)

// maxSnapshotBytes caps the /snapshot body the doctor decodes.
const maxSnapshotBytes = 64 << 20

// checkDataPlane checks gRPC health and the control endpoints. It returns the
// decoded /snapshot, or nil when it was not read.
func checkDataPlane(ctx context.Context, o *Options, fs *findings) *controlapi.CacheSnapshot {
	if o.ConfigOnly {
		// The tokens are only used for calls; a config-only run from outside
		// the cluster must not fail on the in-pod default paths.
		return nil
	}
	ctrlTok, ctrlOK := readToken(o.ControllerTokenPath, "--controller-token-path", fs)
	polTok, polOK := readToken(o.PolicyTokenPath, "--policy-token-path", fs)
	if o.GRPCAddr != "" {
		checkGRPCHealth(ctx, o, fs)
	}
	if o.ControlURL == "" {
		return nil
	}
	base := strings.TrimRight(o.ControlURL, "/")
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	var snap *controlapi.CacheSnapshot
	if ctrlOK {
		snap = checkSnapshot(ctx, hc, base, ctrlTok, fs)
		checkMethodOnly(ctx, hc, base+"/probe", ctrlTok, "POST", CodeProbeEndpoint, "controller", fs)
	}
	if polOK {
		checkMethodOnly(ctx, hc, base+"/policy", polTok, "POST, PUT", CodePolicyEndpoint, "policy", fs)
	}
	checkNoAuth(ctx, hc, base, fs)
	return snap
}

// readToken reads a bearer token file. An empty path is a valid "no token";
// ok is false when the file cannot be used.
func readToken(path, flag string, fs *findings) (tok string, ok bool) {
	if path == "" {
		return "", true
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fs.add(CodeTokenFile, Fail, path, "cannot read the %s token file: %s", flag, oneLine(err))
		return "", false
	}
	tok = strings.TrimSpace(string(b))
	if tok == "" {
		fs.add(CodeTokenFile, Fail, path, "the %s token file is empty", flag)
		return "", false
	}
	fs.add(CodeTokenFile, OK, path, "%s token file readable", flag)
	return tok, true
}

func checkGRPCHealth(ctx context.Context, o *Options, fs *findings) {
	creds := insecure.NewCredentials()
	if o.GRPCTLS != nil {
		creds = credentials.NewTLS(o.GRPCTLS)
	}
	conn, err := grpc.NewClient(o.GRPCAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fs.add(CodeGRPCUnreachable, Fail, o.GRPCAddr, "cannot dial: %s", oneLine(err))
		return
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.OK:
	case codes.Unimplemented:
		fs.add(CodeGRPCHealth, Fail, o.GRPCAddr, "no grpc.health.v1 service here: is this the inferencecache server?")
		return
	case codes.NotFound:
		fs.add(CodeGRPCHealth, Fail, o.GRPCAddr, "the health service does not know the overall service \"\"")
		return
	default:
		fs.add(CodeGRPCUnreachable, Fail, o.GRPCAddr, "health check failed: %s", oneLine(err))
		return
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		fs.add(CodeGRPCHealth, Fail, o.GRPCAddr, "health is %s (starting or draining)", s)
		return
	}
	fs.add(CodeGRPCHealth, OK, o.GRPCAddr, "SERVING")
}

// get issues GET url with token (none when empty) and returns the status,
// the Allow header and up to limit bytes of body. A transport error is
// reported as IC111 and returns ok=false.
func get(ctx context.Context, hc *http.Client, url, token string, limit int64, fs *findings, object string) (code int, allow string, body []byte, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fs.add(CodeControlDown, Fail, object, "bad --control-url: %s", oneLine(err))
		return 0, "", nil, false
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		fs.add(CodeControlDown, Fail, object, "unreachable: %s", oneLine(err))
		return 0, "", nil, false
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		fs.add(CodeControlDown, Fail, object, "cannot read the response: %s", oneLine(err))
		return 0, "", nil, false
	}
	return resp.StatusCode, resp.Header.Get("Allow"), body, true
}

// authStatus reports the auth outcomes every endpoint shares; it returns
// false when code was one of them (or unexpected).
func authStatus(code int, body []byte, audience string, fs *findings, object string) bool {
	msg := strings.Join(strings.Fields(string(body)), " ")
	switch code {
	case http.StatusUnauthorized:
		fs.add(CodeTokenRejected, Fail, object, "401: token missing, expired or not of audience inferencecache.io/%s", audience)
	case http.StatusForbidden:
		fs.add(CodeWrongIdentity, Fail, object, "403: the token's ServiceAccount is not the server's --allowed-controller-sa")
	case http.StatusServiceUnavailable:
		fs.add(CodeReviewFailed, Fail, object, "503: the server's TokenReview failed (fails closed): %s", msg)
	default:
		return true
	}
	return false
}

func checkSnapshot(ctx context.Context, hc *http.Client, base, token string, fs *findings) *controlapi.CacheSnapshot {
	const object = "GET /snapshot"
	code, _, body, ok := get(ctx, hc, base+"/snapshot", token, maxSnapshotBytes+1, fs, object)
	if !ok || !authStatus(code, body, "controller", fs, object) {
		return nil
	}
	if code != http.StatusOK {
		fs.add(CodeControlStatus, Fail, object, "status %d, want 200: %s", code, strings.TrimSpace(string(body)))
		return nil
	}
	if len(body) > maxSnapshotBytes {
		fs.add(CodeSnapshot, Fail, object, "body exceeds %d bytes", maxSnapshotBytes)
		return nil
	}
	var snap controlapi.CacheSnapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		fs.add(CodeSnapshot, Fail, object, "cannot decode the snapshot: %s", oneLine(err))
		return nil
	}
	fs.add(CodeSnapshot, OK, object, "%s, %s, %d prefixes in total%s", plural(len(snap.Replicas), "replica"),
		plural(len(snap.Tenants), "tenant"), snap.TotalPrefixes, instance(snap.ServerInstanceID))
	return &snap
}

func instance(id string) string {
	if id == "" {
		return ""
	}
	return ", server instance " + id
}

// checkMethodOnly proves an endpoint reachable and the token accepted
// without side effects: the auth middleware runs before the method check, so
// a GET that answers 405 passed auth.
func checkMethodOnly(ctx context.Context, hc *http.Client, url, token, wantAllow, code, audience string, fs *findings) {
	object := "GET " + url[strings.LastIndex(url, "/"):]
	status, allow, body, ok := get(ctx, hc, url, token, 4<<10, fs, object)
	if !ok || !authStatus(status, body, audience, fs, object) {
		return
	}
	if status != http.StatusMethodNotAllowed {
		fs.add(CodeControlStatus, Fail, object, "status %d, want 405 (Allow: %s)", status, wantAllow)
		return
	}
	if allow != wantAllow {
		fs.add(CodeControlStatus, Fail, object, "405 with Allow %q, want %q: not the inferencecache control endpoint?", allow, wantAllow)
		return
	}
	fs.add(code, OK, object, "reachable, %s token accepted", tokenWord(token, audience))
}

func tokenWord(token, audience string) string {
	if token == "" {
		return "no"
	}
	return audience
}

// checkNoAuth asks /snapshot without a token: a server with auth answers 401.
func checkNoAuth(ctx context.Context, hc *http.Client, base string, fs *findings) {
	const object = "GET /snapshot (no token)"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/snapshot", nil)
	if err != nil {
		return // get already reported the bad URL
	}
	resp, err := hc.Do(req)
	if err != nil {
		return // the token-bearing calls report the transport error (IC111)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxSnapshotBytes))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		fs.add(CodeNoAuth, Warn, object, "the control endpoints answer without a token (--insecure-disable-auth)")
	case http.StatusUnauthorized:
		fs.add(CodeNoAuth, OK, object, "requests without a token are refused (401)")
	default:
		fs.add(CodeNoAuth, Info, object, "status %d without a token", resp.StatusCode)
	}
}
