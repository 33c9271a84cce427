package servertest_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// TestStart: the server serves on loopback, with auth off and the mutation
// applied, and answers gRPC health through Conn.
func TestStart(t *testing.T) {
	srv := servertest.Start(t, func(c *server.Config) { c.EngineBlockSize = 32 })
	for _, a := range []net.Addr{srv.GRPCAddr(), srv.HTTPAddr(), srv.InternalAddr()} {
		ap, err := net.ResolveTCPAddr("tcp", a.String())
		if err != nil || !ap.IP.IsLoopback() || ap.Port == 0 {
			t.Fatalf("listener %v is not a bound loopback address (%v)", a, err)
		}
	}
	// Auth is off: /snapshot answers without a bearer token.
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + srv.InternalAddr().String() + "/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/snapshot without auth: %d", resp.StatusCode)
	}
	fams := servertest.Scrape(t, srv)
	if up, ok := servertest.Value(fams, servermetrics.NameServerUp, ""); !ok || up != 1 {
		t.Fatalf("server_up = %v (present %v), want 1", up, ok)
	}
	if _, ok := servertest.Value(fams, servermetrics.NameServerUp, "model=x"); ok {
		t.Fatal("Value matched a series by the wrong labels")
	}
	hc, err := healthpb.NewHealthClient(servertest.Conn(t, srv)).Check(t.Context(), &healthpb.HealthCheckRequest{Service: server.ServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hc, err)
	}
}

// TestRunStop: Stop drains the server and Run returns nil.
func TestRunStop(t *testing.T) {
	r := servertest.Run(t, nil)
	r.Stop()
	select {
	case <-r.Done():
		if err := r.Err(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(servertest.StopTimeout):
		t.Fatal("Run did not return after Stop")
	}
	r.Stop() // harmless the second time
}
