package bus

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestTokenEncoding(t *testing.T) {
	for _, tc := range []struct{ id, tok string }{
		{"", "~"},
		{"llama-3-8b", "llama-3-8b"},
		{"meta-llama/Llama-3.1-8B", "meta-llama~2FLlama-3~2E1-8B"},
		{"a.b*c>d e\tf", "a~2Eb~2Ac~3Ed~20e~09f"},
		{"~", "~7E"},
		{"naïve", "na~C3~AFve"},
		{"ns_1", "ns_1"},
	} {
		if got := EncodeToken(tc.id); got != tc.tok {
			t.Errorf("EncodeToken(%q) = %q, want %q", tc.id, got, tc.tok)
		}
		back, err := DecodeToken(tc.tok)
		if err != nil || back != tc.id {
			t.Errorf("DecodeToken(%q) = %q, %v; want %q", tc.tok, back, err, tc.id)
		}
	}
}

// A token is always one valid NATS subject token, decodes back, and
// distinct ids give distinct tokens; long ids hash.
func TestTokenRandomRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]string{}
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.IntN(40))
		for j := range b {
			if r.IntN(3) == 0 {
				b[j] = byte(r.IntN(256))
			} else {
				b[j] = "abcXYZ019-_./*> ~"[r.IntN(17)]
			}
		}
		id := string(b)
		tok := EncodeToken(id)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("EncodeToken(%q) = %q: not a safe token", id, tok)
		}
		for k := 0; k < len(tok); k++ {
			if tok[k] < 0x21 || tok[k] > 0x7e {
				t.Fatalf("EncodeToken(%q) = %q: non-printable byte", id, tok)
			}
		}
		back, err := DecodeToken(tok)
		if err != nil || back != id {
			t.Fatalf("round trip of %q: %q, %v", id, back, err)
		}
		if prev, ok := seen[tok]; ok && prev != id {
			t.Fatalf("ids %q and %q share token %q", prev, id, tok)
		}
		seen[tok] = id
	}
	long := strings.Repeat("/", 100) // 300 encoded bytes
	tok := EncodeToken(long)
	if !strings.HasPrefix(tok, "~h") || len(tok) != 2+64 {
		t.Fatalf("long id token = %q", tok)
	}
	if _, err := DecodeToken(tok); !errors.Is(err, ErrHashed) {
		t.Fatalf("DecodeToken(hashed) err = %v", err)
	}
	if EncodeToken(long+"x") == tok {
		t.Fatal("two long ids share a token")
	}
}

func TestDecodeTokenRejects(t *testing.T) {
	for _, tok := range []string{"", "a.b", "~2", "~zz", "a~41", "x y", "~2e"} {
		if _, err := DecodeToken(tok); !errors.Is(err, ErrBadToken) {
			t.Errorf("DecodeToken(%q) err = %v, want ErrBadToken", tok, err)
		}
	}
}

func TestSubjects(t *testing.T) {
	s := Subject("IC", "ns.a", "m/1")
	if s != "IC.ns~2Ea.m~2F1" {
		t.Fatalf("Subject = %q", s)
	}
	tn, m, err := ParseSubject("IC", s)
	if err != nil || tn != "ns.a" || m != "m/1" {
		t.Fatalf("ParseSubject = %q %q %v", tn, m, err)
	}
	if f := TenantFilter("IC", "ns.a"); f != "IC.ns~2Ea.*" {
		t.Fatalf("TenantFilter = %q", f)
	}
	if StreamSubjects("IC") != "IC.*.*" {
		t.Fatal(StreamSubjects("IC"))
	}
	for _, bad := range []string{"IX.a.b", "IC.a", "IC.a.b.c", "IC.a.~zz"} {
		if _, _, err := ParseSubject("IC", bad); err == nil {
			t.Errorf("ParseSubject(%q) accepted", bad)
		}
	}
	for name, ok := range map[string]bool{"INFERENCECACHE": true, "a-b_1": true, "": false, "a.b": false, "a b": false, strings.Repeat("a", 65): false} {
		if ValidStreamName(name) != ok {
			t.Errorf("ValidStreamName(%q) != %v", name, ok)
		}
	}
}

func BenchmarkAppendToken(b *testing.B) {
	b.ReportAllocs()
	buf := make([]byte, 0, 128)
	for b.Loop() {
		buf = AppendToken(buf[:0], "meta-llama/Llama-3.1-8B-Instruct")
	}
}
