package bustest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus/bustest"
)

func TestMain(m *testing.M) { os.Exit(bustest.Main(m)) }

// The options reach the server, a restart keeps the port and the stream,
// and a fresh store loses it.
func TestServerOptionsAndRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := bustest.StartWith(t, func(o *bustest.Options) { o.MaxPayload = 16 << 10 })
	connect := func() (*nats.Conn, jetstream.JetStream) {
		t.Helper()
		nc, err := nats.Connect(ns.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	nc, js := connect()
	if got := nc.MaxPayload(); got != 16<<10 {
		t.Errorf("max payload %d, want %d", got, 16<<10)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	ns.Stop()
	ns.Restart()
	_, js = connect()
	st, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatalf("the stream did not survive a restart: %v", err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("after a restart: %+v, %v; want 1 message", info, err)
	}

	ns.Stop()
	ns.RestartWith(func(o *bustest.Options) { o.StoreDir = t.TempDir() })
	_, js = connect()
	if _, err := js.Stream(ctx, "S"); err == nil {
		t.Error("a fresh store still has the stream")
	}

	ns.Stop()
	ns.RestartWith(func(o *bustest.Options) { o.JetStream = false })
	_, js = connect()
	if _, err := js.AccountInfo(ctx); err == nil {
		t.Error("JetStream answers with JetStream off")
	}
}
