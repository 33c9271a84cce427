package probe_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/probe"
)

// Stage t2 against a remote tier: a Redis server (miniredis, in process,
// on 127.0.0.1) speaking the real protocol.

func t2Probe(t *testing.T, req controlapi.ProbeRequest) controlapi.ProbeResponse {
	t.Helper()
	p := probe.New(probe.Config{Index: engine.New(engine.Config{}), T2: probe.RemoteT2{Timeout: 5 * time.Second}, Logger: quiet})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if req.Backend == "" {
		req.Backend, req.Model, req.HashScheme = "team-a/lmcache", "llama", "vllm"
	}
	return p.Probe(ctx, req)
}

func TestRemoteT2RoundTrip(t *testing.T) {
	mr := miniredis.RunT(t)
	for name, ep := range map[string]string{"host:port": mr.Addr(), "redis URL": "redis://" + mr.Addr(), "database": "redis://" + mr.Addr() + "/3"} {
		t.Run(name, func(t *testing.T) {
			resp := t2Probe(t, controlapi.ProbeRequest{BackendType: "LMCache", T2Endpoint: ep})
			if resp.Ingest != controlapi.StageOK || resp.Routing != controlapi.StageOK || resp.T2 != controlapi.StageOK || len(resp.Errors) != 0 {
				t.Fatalf("probe %+v", resp)
			}
			// The probe cleans up after itself.
			for _, db := range []int{0, 3} {
				if keys := mr.DB(db).Keys(); len(keys) != 0 {
					t.Errorf("keys left in db %d: %v", db, keys)
				}
			}
		})
	}
	// Any backend type with a remote tier is probed.
	if resp := t2Probe(t, controlapi.ProbeRequest{BackendType: "SGLangHiCache", T2Endpoint: mr.Addr(), T2Provider: "Redis"}); resp.T2 != controlapi.StageOK {
		t.Errorf("SGLangHiCache with a remote tier: %+v", resp)
	}
}

func TestRemoteT2Auth(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.RequireAuth("s3cret")
	if resp := t2Probe(t, controlapi.ProbeRequest{T2Endpoint: "redis://:s3cret@" + mr.Addr()}); resp.T2 != controlapi.StageOK {
		t.Errorf("with the password: %+v", resp)
	}
	resp := t2Probe(t, controlapi.ProbeRequest{T2Endpoint: mr.Addr()})
	if resp.T2 != controlapi.StageFailed || len(resp.Errors) != 1 || resp.Errors[0].Stage != controlapi.StageT2 || !strings.Contains(resp.Errors[0].Message, "NOAUTH") {
		t.Errorf("without the password: %+v", resp)
	}
}

func TestRemoteT2Failures(t *testing.T) {
	// A port nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	for name, c := range map[string]struct {
		req  controlapi.ProbeRequest
		want string
	}{
		"unreachable":     {controlapi.ProbeRequest{T2Endpoint: dead}, "cannot reach the remote tier"},
		"not an endpoint": {controlapi.ProbeRequest{T2Endpoint: "redis-without-port"}, "want host:port"},
		"wrong scheme":    {controlapi.ProbeRequest{T2Endpoint: "lm://" + dead}, `scheme "lm"`},
		"bad database":    {controlapi.ProbeRequest{T2Endpoint: "redis://" + dead + "/x"}, "not a number"},
	} {
		t.Run(name, func(t *testing.T) {
			resp := t2Probe(t, c.req)
			if resp.Ingest != controlapi.StageOK || resp.Routing != controlapi.StageOK || resp.T2 != controlapi.StageFailed {
				t.Fatalf("probe %+v", resp)
			}
			if len(resp.Errors) != 1 || !strings.Contains(resp.Errors[0].Message, c.want) {
				t.Errorf("errors %+v, want %q", resp.Errors, c.want)
			}
		})
	}
	t.Run("a server that does not answer in time", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		go func() {
			c, err := lis.Accept()
			if err == nil {
				defer c.Close()
				time.Sleep(3 * time.Second)
			}
		}()
		p := probe.New(probe.Config{Index: engine.New(engine.Config{}), T2: probe.RemoteT2{Timeout: 200 * time.Millisecond}, Logger: quiet})
		resp := p.Probe(context.Background(), controlapi.ProbeRequest{Backend: "b", Model: "m", HashScheme: "vllm", T2Endpoint: lis.Addr().String()})
		if resp.T2 != controlapi.StageFailed || !strings.Contains(resp.Errors[0].Message, "timeout") {
			t.Errorf("probe %+v", resp)
		}
	})
}

func TestRemoteT2Skipped(t *testing.T) {
	for name, req := range map[string]controlapi.ProbeRequest{
		"no remote tier":     {BackendType: "LMCache"},
		"another provider":   {T2Endpoint: "127.0.0.1:1", T2Provider: "Mooncake"},
		"not LMCache, no t2": {BackendType: "External"},
	} {
		if resp := t2Probe(t, req); resp.T2 != controlapi.StageSkipped || resp.Routing != controlapi.StageOK || len(resp.Errors) != 0 {
			t.Errorf("%s: %+v", name, resp)
		}
	}
}
