package endpoints

import (
	"errors"
	"testing"
)

func TestNewPool(t *testing.T) {
	p, err := NewPool("team-a", "", map[string]Model{"lora-a": {ModelID: "base", AdapterID: "lora-a"}}, []Endpoint{
		{ReplicaID: "pod-b", Address: "10.0.0.8:8000"},
		{ReplicaID: "pod-a", Address: "10.0.0.7:8000"},
		{ReplicaID: "pod-v6", Address: "[::1]:8000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.HashScheme != DefaultHashScheme || p.Len() != 3 {
		t.Fatalf("pool %+v", p)
	}
	if got := p.Endpoints[0].Address; got != "10.0.0.7:8000" {
		t.Fatalf("not sorted by address: first %q", got)
	}
	if ep, ok := p.ByAddress("[::1]:8000"); !ok || ep.ReplicaID != "pod-v6" {
		t.Fatalf("ByAddress v6: %+v %v", ep, ok)
	}
	if ep, ok := p.ByReplica("pod-b"); !ok || ep.Address != "10.0.0.8:8000" {
		t.Fatalf("ByReplica: %+v %v", ep, ok)
	}
	if m := p.Resolve("lora-a"); m != (Model{ModelID: "base", AdapterID: "lora-a"}) {
		t.Fatalf("Resolve adapter: %+v", m)
	}
	if m := p.Resolve("other"); m != (Model{ModelID: "other"}) {
		t.Fatalf("Resolve default: %+v", m)
	}
	var nilPool *Pool
	if nilPool.Len() != 0 {
		t.Fatal("nil pool has endpoints")
	}
}

func TestNewPoolRejects(t *testing.T) {
	f := func(name string, want error, tenant string, eps ...Endpoint) {
		t.Helper()
		if _, err := NewPool(tenant, "vllm", nil, eps); !errors.Is(err, want) {
			t.Errorf("%s: got %v, want %v", name, err, want)
		}
	}
	f("no tenant", ErrInvalidPool, "")
	f("no replica", ErrInvalidEndpoint, "t", Endpoint{Address: "10.0.0.1:80"})
	f("no port", ErrInvalidEndpoint, "t", Endpoint{ReplicaID: "a", Address: "10.0.0.1"})
	f("port 0", ErrInvalidEndpoint, "t", Endpoint{ReplicaID: "a", Address: "10.0.0.1:0"})
	f("hostname", ErrInvalidEndpoint, "t", Endpoint{ReplicaID: "a", Address: "pod-a:80"})
	f("v6 zone", ErrInvalidEndpoint, "t", Endpoint{ReplicaID: "a", Address: "[fe80::1%eth0]:80"})
	f("dup address", ErrInvalidPool, "t", Endpoint{ReplicaID: "a", Address: "10.0.0.1:80"}, Endpoint{ReplicaID: "b", Address: "10.0.0.1:80"})
	f("dup replica", ErrInvalidPool, "t", Endpoint{ReplicaID: "a", Address: "10.0.0.1:80"}, Endpoint{ReplicaID: "a", Address: "10.0.0.2:80"})
	if _, err := NewPool("t", "", map[string]Model{"x": {}}, nil); !errors.Is(err, ErrInvalidPool) {
		t.Errorf("empty model id: %v", err)
	}
}
