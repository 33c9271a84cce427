package server_test

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/inferencecache/inferencecache/controlapi"
)

// TestE2EProbeT2: POST /probe on a real server runs stage t2 against the
// remote tier the request names (a Redis server on 127.0.0.1), and reports
// a dead tier as failed, which the controller turns into ProbeT2Failed.
func TestE2EProbeT2(t *testing.T) {
	r := start(t, testConfig())
	mr := miniredis.RunT(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	for _, c := range []struct {
		endpoint, want string
	}{
		{"redis://" + mr.Addr(), controlapi.StageOK},
		{dead, controlapi.StageFailed},
		{"", controlapi.StageSkipped},
	} {
		body, _ := json.Marshal(controlapi.ProbeRequest{Backend: "team-a/lmcache", Model: "llama", HashScheme: "vllm", BackendType: "LMCache", T2Endpoint: c.endpoint})
		code, out := httpDo(t, http.MethodPost, "http://"+r.InternalAddr().String()+"/probe", string(body), nil)
		var resp controlapi.ProbeResponse
		if code != http.StatusOK || json.Unmarshal([]byte(out), &resp) != nil {
			t.Fatalf("endpoint %q: %d %s", c.endpoint, code, out)
		}
		if resp.Ingest != controlapi.StageOK || resp.Routing != controlapi.StageOK || resp.T2 != c.want {
			t.Errorf("endpoint %q: %+v, want t2 %s", c.endpoint, resp, c.want)
		}
		if c.want == controlapi.StageFailed && (len(resp.Errors) != 1 || resp.Errors[0].Stage != controlapi.StageT2) {
			t.Errorf("a failed t2 without its diagnostic: %+v", resp)
		}
	}
}
