package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// resolvedEqual compares what two snapshots resolve to (tenants, quotas, LFU
// flag), ignoring generation and the retained body.
func resolvedEqual(a, b *Snapshot) bool {
	return reflect.DeepEqual(a.tenants, b.tenants) &&
		reflect.DeepEqual(a.quotas, b.quotas) &&
		a.anyLFU == b.anyLFU &&
		reflect.DeepEqual(a.nsTopologies, b.nsTopologies) &&
		sameJSON(a.topologies, b.topologies) && sameJSON(a.templates, b.templates)
}

// sameJSON compares by encoding, so an empty list and an absent one (the
// same body through omitempty) compare equal.
func sameJSON(a, b any) bool {
	ea, err1 := json.Marshal(a)
	eb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

// decodeErrorKnown reports whether err is one of the errors Decode documents.
func decodeErrorKnown(err error) bool {
	for _, s := range []error{ErrTooLarge, ErrUnsupportedVersion, ErrTrailingData, ErrEmptyBody, ErrInvalidEntry} {
		if errors.Is(err, s) {
			return true
		}
	}
	return strings.HasPrefix(err.Error(), "policy: invalid JSON: ")
}

// FuzzDecode: Decode never panics; a rejected body yields no Body and a known,
// prefixed error; an accepted body re-encodes and re-decodes to the same Body
// (normalization is idempotent) and to the same Build result. The kept seed
// corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"version": 7, "policies": [], "tenants": []}`,
		`{"version": 3, "policies": [{"namespace": "a"}]}`,
		`{"version": 5, "policies": [{"namespace": "a", "routingFloorScore": 0}]}`,
		`{"version": 6, "policies": [{"namespace": "a", "strategy": {"requireChain": true}}]}`,
		`{"version": 7, "policies": [{"namespace": "a", "eviction": "LFU", "evictionTTL": -1}], "tenants": [{"tenantID": "a", "maxIndexEntries": -1}]}`,
		`{"version": 8}`,
		`{"version": 9}`,
		`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "prefillPools": [{"name": "p", "replicas": 2}], "decodePools": [{"name": "d"}], "transport": "NIXL", "skipPrefillBelowTokens": 0, "kvLocality": "Node"}]}`,
		`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "{{ s }}", "slots": [{"name": "s", "type": "Stable", "required": true}]}]}`,
		`{"version": 7, "pdTopologies": [{"namespace": "a", "name": "t"}]}`,
		`{"version": 7} {}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(bytes.NewReader(data))
		if err != nil {
			if b != nil {
				t.Fatalf("Decode returned a body together with %v", err)
			}
			if !decodeErrorKnown(err) {
				t.Fatalf("unexpected error shape: %v", err)
			}
			return
		}
		if b.Version < MinimumAcceptedVersion || b.Version > PropagationVersion {
			t.Fatalf("accepted version %d", b.Version)
		}
		s1 := Build(b)

		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("cannot re-encode an accepted body: %v", err)
		}
		// The re-encoding may exceed MaxBodyBytes (normalization adds fields,
		// Marshal escapes HTML), so re-decode without the size limit.
		b2, err := decodeBytes(enc)
		if err != nil {
			t.Fatalf("re-encoded body %s rejected: %v", enc, err)
		}
		// (Compared by encoding: an empty "tenants" list becomes nil through
		// omitempty, which is the same body.)
		enc2, err := json.Marshal(b2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("re-decoded body differs:\n%s\n%s", enc, enc2)
		}
		if s2 := Build(b2); !resolvedEqual(s1, s2) {
			t.Fatalf("Build differs after a round trip of %s", enc)
		}
		// Resolved invariants.
		for id, tn := range s1.tenants {
			if id == "" {
				t.Fatal("empty tenant id resolved")
			}
			if tn.TTL <= 0 || tn.MinimumPrefixTokens < 0 || tn.MinimumMatchedTokens < 0 ||
				tn.RoutingFloorScore < 0 || tn.LookupTimeout < 0 || tn.MaxIndexEntries < 0 {
				t.Fatalf("tenant %q out of range: %+v", id, *tn)
			}
			if id == ReservedTenantID && tn.HasQuota {
				t.Fatal("reserved tenant got a quota")
			}
		}
		for k, top := range s1.topologies {
			if top.SkipBelow < 0 || (top.Locality != LocalityNone && top.Locality != LocalityNode && top.Locality != LocalityZone) {
				t.Fatalf("topology %s out of range: %+v", k, top)
			}
			if s1.Topology(k, "") != top {
				t.Fatalf("topology %s does not resolve by its key", k)
			}
		}
		for k, tp := range s1.templates {
			if tp.Body == "" || tp.Revision == "" || (tp.TemplateRevision == "" && len(tp.Revision) != 16) {
				t.Fatalf("template %s resolved to %+v", k, tp)
			}
		}
	})
}
