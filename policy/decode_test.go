package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// shapes of one optional wire field.
const (
	shapeMissing  = "missing"
	shapeNull     = "null"
	shapeZero     = "zero"
	shapeExplicit = "explicit"
)

var allShapes = []string{shapeMissing, shapeNull, shapeZero, shapeExplicit}

var acceptedVersions = []int{3, 4, 5, 6, 7, 8}

// fieldCase describes one optional policy field: how to render it in each
// shape, what the resolved Tenant holds afterwards for a given version, and
// (for the version-gated fields) what the normalized wire body holds.
type fieldCase struct {
	name string
	// render returns the JSON members to splice into the policy object for a
	// shape ("" for missing).
	render func(shape string) string
	// got reads the resolved knob.
	got func(*Tenant) any
	// want is the resolved knob for (version, shape).
	want func(v int, shape string) any
	// body reads the normalized wire field; wantBody is its expected value
	// (nil funcs skip the check).
	body     func(*ResolvedPolicy) any
	wantBody func(v int, shape string) any
}

// member renders `"key": <value>` for the scalar shapes.
func member(key, zero, explicit string) func(string) string {
	return func(shape string) string {
		switch shape {
		case shapeNull:
			return fmt.Sprintf("%q: null", key)
		case shapeZero:
			return fmt.Sprintf("%q: %s", key, zero)
		case shapeExplicit:
			return fmt.Sprintf("%q: %s", key, explicit)
		}
		return ""
	}
}

// strategyMember renders `"strategy": {"key": <value>}`; the missing shape
// keeps the strategy object but omits the key.
func strategyMember(key string) func(string) string {
	inner := member(key, "false", "true")
	return func(shape string) string {
		return fmt.Sprintf(`"strategy": {%s}`, inner(shape))
	}
}

// boolOr reads a *bool as "nil" or its value, for comparisons.
func boolOr(p *bool) any {
	if p == nil {
		return "nil"
	}
	return *p
}

func strategyBool(p *ResolvedPolicy, pick func(*LookupStrategy) *bool) any {
	if p.Strategy == nil {
		return "nil"
	}
	return boolOr(pick(p.Strategy))
}

// boolField builds a case for an optional bool whose zero shape is false and
// explicit shape is true; introduced is the version that added it.
func boolField(name string, render func(string) string, get func(*Tenant) bool, def bool, introduced int,
	body func(*ResolvedPolicy) any) fieldCase {
	return fieldCase{
		name:   name,
		render: render,
		got:    func(t *Tenant) any { return get(t) },
		want: func(_ int, shape string) any {
			switch shape {
			case shapeZero:
				return false
			case shapeExplicit:
				return true
			}
			return def // missing and null resolve to the default in every version
		},
		body: body,
		wantBody: func(v int, shape string) any {
			switch shape {
			case shapeZero:
				return false
			case shapeExplicit:
				return true
			}
			if v < introduced {
				return def // normalized
			}
			return "nil" // stored as written
		},
	}
}

var fieldCases = []fieldCase{
	{
		name:   "minimumMatchedTokens",
		render: member("minimumMatchedTokens", "0", "128"),
		got:    func(t *Tenant) any { return t.MinimumMatchedTokens },
		want: func(v int, shape string) any {
			switch {
			case shape == shapeExplicit:
				return int32(128)
			case v < 4:
				return DefaultMinimumMatchedTokens // a v3 body cannot opt out
			default:
				return int32(0) // 0, null and missing are the same int32 on the wire
			}
		},
		body: func(p *ResolvedPolicy) any { return p.MinimumMatchedTokens },
		wantBody: func(v int, shape string) any {
			switch {
			case shape == shapeExplicit:
				return int32(128)
			case v < 4:
				return int32(64)
			default:
				return int32(0)
			}
		},
	},
	{
		name:   "routingFloorScore",
		render: member("routingFloorScore", "0", "5"),
		got:    func(t *Tenant) any { return t.RoutingFloorScore },
		want: func(_ int, shape string) any {
			switch shape {
			case shapeZero:
				return float32(0) // explicit opt-out survives in every version
			case shapeExplicit:
				return float32(5)
			}
			return DefaultRoutingFloorScore
		},
		body: func(p *ResolvedPolicy) any {
			if p.RoutingFloorScore == nil {
				return "nil"
			}
			return *p.RoutingFloorScore
		},
		wantBody: func(v int, shape string) any {
			switch shape {
			case shapeZero:
				return float32(0)
			case shapeExplicit:
				return float32(5)
			}
			if v < 5 {
				return DefaultRoutingFloorScore
			}
			return "nil"
		},
	},
	boolField("strategy.enableChainMatching", strategyMember("enableChainMatching"),
		func(t *Tenant) bool { return t.EnableChainMatching }, DefaultEnableChainMatching, 6,
		func(p *ResolvedPolicy) any {
			return strategyBool(p, func(s *LookupStrategy) *bool { return s.EnableChainMatching })
		}),
	boolField("strategy.requireChain", strategyMember("requireChain"),
		func(t *Tenant) bool { return t.RequireChain }, DefaultRequireChain, 6,
		func(p *ResolvedPolicy) any {
			return strategyBool(p, func(s *LookupStrategy) *bool { return s.RequireChain })
		}),
	boolField("strategy.enableTenantHot", strategyMember("enableTenantHot"),
		func(t *Tenant) bool { return t.EnableTenantHot }, DefaultEnableTenantHot, 6,
		func(p *ResolvedPolicy) any {
			return strategyBool(p, func(s *LookupStrategy) *bool { return s.EnableTenantHot })
		}),
	{
		// The whole strategy object in the four shapes; zero is {} (every
		// gate at its default) and explicit sets all three non-defaults.
		name: "strategy",
		render: func(shape string) string {
			switch shape {
			case shapeNull:
				return `"strategy": null`
			case shapeZero:
				return `"strategy": {}`
			case shapeExplicit:
				return `"strategy": {"enableChainMatching": false, "requireChain": true, "enableTenantHot": false}`
			}
			return ""
		},
		got: func(t *Tenant) any { return [3]bool{t.EnableChainMatching, t.RequireChain, t.EnableTenantHot} },
		want: func(_ int, shape string) any {
			if shape == shapeExplicit {
				return [3]bool{false, true, false}
			}
			return [3]bool{true, false, true}
		},
		body: func(p *ResolvedPolicy) any {
			if p.Strategy == nil {
				return "nil"
			}
			return [3]any{boolOr(p.Strategy.EnableChainMatching), boolOr(p.Strategy.RequireChain), boolOr(p.Strategy.EnableTenantHot)}
		},
		wantBody: func(v int, shape string) any {
			switch {
			case shape == shapeExplicit:
				return [3]any{false, true, false}
			case v < 6:
				return [3]any{true, false, true}
			case shape == shapeZero:
				return [3]any{"nil", "nil", "nil"}
			}
			return "nil"
		},
	},
	boolField("affinityRouting", member("affinityRouting", "false", "true"),
		func(t *Tenant) bool { return t.AffinityRouting }, DefaultAffinityRoutingEnabled, 7,
		func(p *ResolvedPolicy) any { return boolOr(p.AffinityRouting) }),
}

func policyBody(version int, members ...string) string {
	var kept []string
	kept = append(kept, `"namespace": "team-a"`)
	for _, m := range members {
		if m != "" {
			kept = append(kept, m)
		}
	}
	return fmt.Sprintf(`{"version": %d, "policies": [{%s}]}`, version, strings.Join(kept, ", "))
}

func mustDecode(t *testing.T, body string) *Body {
	t.Helper()
	b, err := Decode(strings.NewReader(body))
	if err != nil {
		t.Fatalf("Decode(%s): %v", body, err)
	}
	return b
}

// TestVersionFieldShapes covers every accepted version × every shape of each
// version-gated field, checking both the normalized wire body (v7 stored as
// written, older versions filled in) and the resolved Tenant.
func TestVersionFieldShapes(t *testing.T) {
	for _, fc := range fieldCases {
		for _, v := range acceptedVersions {
			for _, shape := range allShapes {
				t.Run(fmt.Sprintf("%s/v%d/%s", fc.name, v, shape), func(t *testing.T) {
					body := policyBody(v, fc.render(shape))
					b := mustDecode(t, body)
					if len(b.Policies) != 1 {
						t.Fatalf("decoded %d policies, want 1", len(b.Policies))
					}
					if fc.body != nil {
						if got, want := fc.body(&b.Policies[0]), fc.wantBody(v, shape); !reflect.DeepEqual(got, want) {
							t.Errorf("normalized wire field = %#v, want %#v (body %s)", got, want, body)
						}
					}
					snap := Build(b)
					tn := snap.Tenant("team-a")
					if !tn.HasPolicy {
						t.Fatalf("team-a has no policy")
					}
					if got, want := fc.got(tn), fc.want(v, shape); !reflect.DeepEqual(got, want) {
						t.Errorf("resolved = %#v, want %#v (body %s)", got, want, body)
					}
					// Every other knob of the policy tenant keeps its policy default.
					if tn.TTL != DefaultTTL || tn.Eviction != LRU || tn.MinimumPrefixTokens != 0 || tn.LookupTimeout != 0 || tn.HasQuota {
						t.Errorf("unrelated knobs changed: %+v", *tn)
					}
					// A tenant the body does not mention is at the defaults.
					if got := *snap.Tenant("team-z"); got != Defaults {
						t.Errorf("unmentioned tenant = %+v, want Defaults", got)
					}
				})
			}
		}
	}
}

// TestVersionIndependentFields covers the knobs every accepted version
// carries byte-for-byte, in every version.
func TestVersionIndependentFields(t *testing.T) {
	type knob struct {
		member string // "" = missing
		check  func(*Tenant) error
	}
	ttl := func(want time.Duration) func(*Tenant) error {
		return func(tn *Tenant) error {
			if tn.TTL != want {
				return fmt.Errorf("TTL = %v, want %v", tn.TTL, want)
			}
			return nil
		}
	}
	alg := func(want Algorithm) func(*Tenant) error {
		return func(tn *Tenant) error {
			if tn.Eviction != want {
				return fmt.Errorf("Eviction = %v, want %v", tn.Eviction, want)
			}
			return nil
		}
	}
	timeout := func(want time.Duration) func(*Tenant) error {
		return func(tn *Tenant) error {
			if tn.LookupTimeout != want {
				return fmt.Errorf("LookupTimeout = %v, want %v", tn.LookupTimeout, want)
			}
			return nil
		}
	}
	prefix := func(want int32) func(*Tenant) error {
		return func(tn *Tenant) error {
			if tn.MinimumPrefixTokens != want {
				return fmt.Errorf("MinimumPrefixTokens = %v, want %v", tn.MinimumPrefixTokens, want)
			}
			return nil
		}
	}
	cases := map[string]knob{
		"evictionTTL/missing":  {"", ttl(DefaultTTL)},
		"evictionTTL/null":     {`"evictionTTL": null`, ttl(DefaultTTL)},
		"evictionTTL/zero":     {`"evictionTTL": 0`, ttl(DefaultTTL)},
		"evictionTTL/negative": {`"evictionTTL": -1`, ttl(DefaultTTL)},
		"evictionTTL/explicit": {`"evictionTTL": 900000000000`, ttl(15 * time.Minute)},
		"evictionTTL/1ns":      {`"evictionTTL": 1`, ttl(time.Nanosecond)},

		"eviction/missing": {"", alg(LRU)},
		"eviction/null":    {`"eviction": null`, alg(LRU)},
		"eviction/empty":   {`"eviction": ""`, alg(LRU)},
		"eviction/lfu":     {`"eviction": "lfu"`, alg(LFU)},
		"eviction/LFU":     {`"eviction": "LFU"`, alg(LFU)},
		"eviction/Lfu-pad": {`"eviction": " Lfu "`, alg(LFU)},
		"eviction/lru":     {`"eviction": "lru"`, alg(LRU)},
		"eviction/LRU":     {`"eviction": "LRU"`, alg(LRU)},
		"eviction/garbage": {`"eviction": "most-recently-used"`, alg(LRU)},

		"lookupTimeoutMs/missing":  {"", timeout(0)},
		"lookupTimeoutMs/null":     {`"lookupTimeoutMs": null`, timeout(0)},
		"lookupTimeoutMs/zero":     {`"lookupTimeoutMs": 0`, timeout(0)},
		"lookupTimeoutMs/negative": {`"lookupTimeoutMs": -25`, timeout(0)},
		"lookupTimeoutMs/explicit": {`"lookupTimeoutMs": 25`, timeout(25 * time.Millisecond)},

		"minimumPrefixTokens/missing":  {"", prefix(0)},
		"minimumPrefixTokens/null":     {`"minimumPrefixTokens": null`, prefix(0)},
		"minimumPrefixTokens/zero":     {`"minimumPrefixTokens": 0`, prefix(0)},
		"minimumPrefixTokens/negative": {`"minimumPrefixTokens": -3`, prefix(0)},
		"minimumPrefixTokens/explicit": {`"minimumPrefixTokens": 32`, prefix(32)},

		// A negative floor (Go-side only for v4+; JSON allows it) resolves to
		// "no floor", not to the default.
		"minimumMatchedTokens/negative": {`"minimumMatchedTokens": -5`, func(tn *Tenant) error {
			if tn.MinimumMatchedTokens != 0 {
				return fmt.Errorf("MinimumMatchedTokens = %d, want 0", tn.MinimumMatchedTokens)
			}
			return nil
		}},
		"routingFloorScore/negative": {`"routingFloorScore": -1.5`, func(tn *Tenant) error {
			if tn.RoutingFloorScore != 0 {
				return fmt.Errorf("RoutingFloorScore = %v, want 0", tn.RoutingFloorScore)
			}
			return nil
		}},
	}
	for name, k := range cases {
		for _, v := range acceptedVersions {
			t.Run(fmt.Sprintf("%s/v%d", name, v), func(t *testing.T) {
				b := mustDecode(t, policyBody(v, k.member))
				snap := Build(b)
				tn := snap.Tenant("team-a")
				if !tn.HasPolicy {
					t.Fatal("team-a has no policy")
				}
				if err := k.check(tn); err != nil {
					t.Error(err)
				}
				if want := tn.Eviction == LFU; snap.AnyLFU() != want {
					t.Errorf("AnyLFU = %v, want %v", snap.AnyLFU(), want)
				}
			})
		}
	}
}

// TestV7StoredAsWritten checks that Decode leaves a v7 body exactly as a plain
// unmarshal produces it (no normalization), and that Store.Apply keeps that
// very body.
func TestV7StoredAsWritten(t *testing.T) {
	const body = `{
	  "version": 7,
	  "policies": [
	    {"namespace": "bare"},
	    {"namespace": "opt-out", "minimumMatchedTokens": 0, "routingFloorScore": 0,
	     "affinityRouting": false, "strategy": {"enableTenantHot": false}},
	    {"namespace": "full", "evictionTTL": 900000000000, "minimumPrefixTokens": 32,
	     "minimumMatchedTokens": 128, "routingFloorScore": 5, "lookupTimeoutMs": 25,
	     "eviction": "lfu", "strategy": {"enableChainMatching": true, "requireChain": false,
	     "enableTenantHot": true}, "affinityRouting": true}
	  ],
	  "tenants": [{"tenantID": "team-a", "maxIndexEntries": 100000, "isolationMode": "Fairness"}]
	}`
	var plain Body
	if err := json.Unmarshal([]byte(body), &plain); err != nil {
		t.Fatal(err)
	}
	got := mustDecode(t, body)
	if !reflect.DeepEqual(*got, plain) {
		t.Fatalf("v7 body was modified by Decode:\n got %+v\nwant %+v", *got, plain)
	}
	s := NewStore()
	snap := s.Apply(got)
	if snap.Body() != got || s.Load().Body() != got {
		t.Fatal("store does not keep the applied body")
	}
	if !reflect.DeepEqual(*snap.Body(), plain) {
		t.Fatal("stored body differs from the body as written")
	}
	bare := snap.Tenant("bare")
	want := Defaults
	want.HasPolicy = true
	want.MinimumMatchedTokens = 0 // a v7 policy without the field has no floor
	if *bare != want {
		t.Errorf("bare = %+v, want %+v", *bare, want)
	}
	opt := snap.Tenant("opt-out")
	if opt.MinimumMatchedTokens != 0 || opt.RoutingFloorScore != 0 || opt.AffinityRouting || opt.EnableTenantHot ||
		!opt.EnableChainMatching || opt.RequireChain {
		t.Errorf("opt-out = %+v", *opt)
	}
	full := snap.Tenant("full")
	wantFull := Tenant{
		HasPolicy: true, TTL: 15 * time.Minute, Eviction: LFU, MinimumPrefixTokens: 32,
		MinimumMatchedTokens: 128, RoutingFloorScore: 5, LookupTimeout: 25 * time.Millisecond,
		AffinityRouting: true, EnableChainMatching: true, RequireChain: false, EnableTenantHot: true,
	}
	if *full != wantFull {
		t.Errorf("full = %+v, want %+v", *full, wantFull)
	}
	if !snap.AnyLFU() {
		t.Error("AnyLFU = false with an lfu namespace")
	}
}

// TestOlderVersionsNormalizeToV7Shape: a CRD-defaulted policy sent as v3..v6
// (each version carrying only the fields it had) stores the same shape as the
// v7 body the same CR produces.
func TestOlderVersionsNormalizeToV7Shape(t *testing.T) {
	v7 := mustDecode(t, `{"version": 7, "policies": [{"namespace": "a", "evictionTTL": 60000000000,
		"minimumMatchedTokens": 64, "routingFloorScore": 0.1, "affinityRouting": true,
		"strategy": {"enableChainMatching": true, "requireChain": false, "enableTenantHot": true}}]}`)
	for _, v := range []int{3, 4, 5, 6} {
		// Each version carries, CRD-defaulted, the fields it already had.
		members := []string{`"evictionTTL": 60000000000`}
		if v >= 4 {
			members = append(members, `"minimumMatchedTokens": 64`)
		}
		if v >= 5 {
			members = append(members, `"routingFloorScore": 0.1`)
		}
		if v >= 6 {
			members = append(members, `"strategy": {"enableChainMatching": true, "requireChain": false, "enableTenantHot": true}`)
		}
		body := fmt.Sprintf(`{"version": %d, "policies": [{"namespace": "a", %s}]}`, v, strings.Join(members, ", "))
		b := mustDecode(t, body)
		b.Version = 7
		if !reflect.DeepEqual(b, v7) {
			gb, _ := json.Marshal(b)
			wb, _ := json.Marshal(v7)
			t.Errorf("v%d normalized to %s, want %s", v, gb, wb)
		}
	}
}

func TestRejectedVersions(t *testing.T) {
	cases := map[string]string{
		"v2":      `{"version": 2, "policies": []}`,
		"v9":      `{"version": 9, "policies": []}`,
		"missing": `{"policies": [{"namespace": "a"}]}`,
		"null":    `{"version": null}`,
		"zero":    `{"version": 0}`,
		"neg":     `{"version": -7}`,
		"huge":    `{"version": 9007199254740993}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := Decode(strings.NewReader(body))
			if b != nil {
				t.Errorf("Decode returned a body with the error")
			}
			if !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("err = %v, want ErrUnsupportedVersion", err)
			}
			if !strings.Contains(err.Error(), "unsupported policy snapshot version") ||
				!strings.Contains(err.Error(), "accepted 3 to 8") {
				t.Errorf("message %q does not name the problem", err)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	big := func(n int) string {
		// A valid v7 body padded with JSON whitespace to exactly n bytes.
		head := `{"version": 7, "policies": []}`
		return head + strings.Repeat(" ", n-len(head))
	}
	cases := []struct {
		name     string
		body     string
		sentinel error    // nil: only check the message
		contains []string // substrings of the message
	}{
		{"unknown top-level field", `{"version": 7, "policies": [], "bogus": 1}`, nil, []string{"invalid JSON", `unknown field "bogus"`}},
		{"unknown policy field", `{"version": 7, "policies": [{"namespace": "a", "ttl": 5}]}`, nil, []string{`unknown field "ttl"`}},
		{"unknown strategy field", `{"version": 7, "policies": [{"namespace": "a", "strategy": {"x": true}}]}`, nil, []string{`unknown field "x"`}},
		{"unknown tenant field", `{"version": 7, "tenants": [{"tenantID": "a", "maxIndexEntries": 1, "mode": "x"}]}`, nil, []string{`unknown field "mode"`}},
		{"v6 body with a v8 field", `{"version": 6, "policies": [{"namespace": "a", "futureKnob": 1}]}`, nil, []string{`unknown field "futureKnob"`}},
		{"trailing object", `{"version": 7}{"version": 7}`, ErrTrailingData, []string{"trailing data"}},
		{"trailing garbage", `{"version": 7} x`, ErrTrailingData, []string{"trailing data"}},
		{"trailing bracket", `{"version": 7}]`, ErrTrailingData, []string{"trailing data"}},
		{"trailing comma", `{"version": 7},`, ErrTrailingData, []string{"trailing data"}},
		{"truncated", `{"version": 7, "policies": [`, nil, []string{"invalid JSON", "unexpected EOF"}},
		{"not an object", `[]`, nil, []string{"invalid JSON", "cannot unmarshal array"}},
		{"string version", `{"version": "7"}`, nil, []string{"invalid JSON", "version"}},
		{"fractional version", `{"version": 7.5}`, nil, []string{"invalid JSON"}},
		{"int32 overflow", `{"version": 7, "policies": [{"namespace": "a", "lookupTimeoutMs": 3000000000}]}`, nil, []string{"invalid JSON", "lookupTimeoutMs"}},
		{"float32 overflow", `{"version": 7, "policies": [{"namespace": "a", "routingFloorScore": 1e39}]}`, nil, []string{"invalid JSON", "routingFloorScore"}},
		{"duration as string", `{"version": 7, "policies": [{"namespace": "a", "evictionTTL": "15m"}]}`, nil, []string{"invalid JSON", "evictionTTL"}},
		{"nbsp only", "\u00a0", nil, []string{"invalid JSON"}},
		{"empty", ``, ErrEmptyBody, []string{"empty body"}},
		{"whitespace only", " \r\n\t ", ErrEmptyBody, []string{"empty body"}},
		{"over 1 MiB", big(MaxBodyBytes + 1), ErrTooLarge, []string{"exceeds 1 MiB"}},
		{"far over 1 MiB", big(3 * MaxBodyBytes), ErrTooLarge, []string{"exceeds 1 MiB"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Decode(strings.NewReader(tc.body))
			if err == nil {
				t.Fatalf("Decode accepted %q as %+v", tc.body, b)
			}
			if b != nil {
				t.Error("Decode returned a body with the error")
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Errorf("err = %v, want %v", err, tc.sentinel)
			}
			if !strings.HasPrefix(err.Error(), "policy: ") {
				t.Errorf("message %q lacks the package prefix", err)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not contain %q", err, s)
				}
			}
		})
	}

	t.Run("exactly 1 MiB is accepted", func(t *testing.T) {
		if _, err := Decode(strings.NewReader(big(MaxBodyBytes))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("trailing whitespace is accepted", func(t *testing.T) {
		mustDecode(t, "\n{\"version\": 7}\r\n\t ")
	})
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := Decode(io.MultiReader(strings.NewReader(`{"version": 7`), iotest.ErrReader(boom)))
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "cannot read body") {
			t.Errorf("err = %v, want wrapped boom naming the read", err)
		}
	})
	t.Run("one-byte reads", func(t *testing.T) {
		b, err := Decode(iotest.OneByteReader(strings.NewReader(`{"version": 5, "policies": [{"namespace": "a"}]}`)))
		if err != nil {
			t.Fatal(err)
		}
		if b.Policies[0].AffinityRouting == nil || !*b.Policies[0].AffinityRouting {
			t.Error("v5 body not normalized")
		}
	})
}
