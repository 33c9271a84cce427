package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Subjects. Every message of a (tenant, model) goes to one subject,
//
//	<stream>.<tenant token>.<model token>
//
// so the stream's order is the producer's order for each replica (a replica
// reports one (tenant, model)), and a server can consume a subset of models
// with filter subjects: <stream>.<tenant>.<model> for one model,
// <stream>.<tenant>.* for a tenant, <stream>.> (or no filter) for all.
// See docs/scaleout.md.
//
// Tokens. A NATS subject token cannot be empty or contain '.', '*', '>' or
// whitespace, and long subjects cost on every message. EncodeToken keeps
// the bytes [A-Za-z0-9_-] as they are, writes every other byte as '~'
// followed by two upper-case hex digits, and writes the empty id as a lone
// "~": reversible (DecodeToken) and readable for the common Kubernetes and
// Hugging Face names ("meta-llama/Llama-3.1-8B" becomes
// "meta-llama~2FLlama-3~2E1-8B"). An encoding longer than MaxTokenBytes is
// replaced by "~h" and the hex SHA-256 of the id: still one token per id,
// still safe, no longer reversible (the payload carries the ids anyway).
const (
	// MaxTokenBytes bounds one encoded token (NATS's default control line
	// of 4 KiB must hold the subject).
	MaxTokenBytes = 256

	escapeByte   = '~'
	hashedPrefix = "~h"
)

// Errors of DecodeToken and ParseSubject.
var (
	ErrBadToken   = errors.New("bus: malformed subject token")
	ErrHashed     = errors.New("bus: the token is a hash of a long id and cannot be decoded")
	ErrBadSubject = errors.New("bus: not a subject of this stream")
)

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

const upperHex = "0123456789ABCDEF"

// AppendToken appends the subject token of id to dst.
func AppendToken(dst []byte, id string) []byte {
	if id == "" {
		return append(dst, escapeByte)
	}
	n := 0
	for i := 0; i < len(id); i++ {
		if plain(id[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxTokenBytes {
		sum := sha256.Sum256([]byte(id))
		dst = append(dst, hashedPrefix...)
		return hex.AppendEncode(dst, sum[:])
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if plain(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, escapeByte, upperHex[c>>4], upperHex[c&15])
	}
	return dst
}

// EncodeToken returns the subject token of id.
func EncodeToken(id string) string { return string(AppendToken(nil, id)) }

// DecodeToken inverts EncodeToken. A hashed token returns ErrHashed.
func DecodeToken(tok string) (string, error) {
	switch {
	case tok == "~":
		return "", nil
	case tok == "":
		return "", fmt.Errorf("%w: empty", ErrBadToken)
	case strings.HasPrefix(tok, hashedPrefix):
		return "", ErrHashed
	case len(tok) > MaxTokenBytes:
		return "", fmt.Errorf("%w: %d bytes over %d (a long id is hashed)", ErrBadToken, len(tok), MaxTokenBytes)
	}
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		if c != escapeByte || i+2 >= len(tok) {
			return "", fmt.Errorf("%w: %q at byte %d", ErrBadToken, c, i)
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: bad escape at byte %d", ErrBadToken, i)
		}
		v := byte(hi<<4 | lo)
		if plain(v) {
			// Not what EncodeToken writes: one id, one token.
			return "", fmt.Errorf("%w: needless escape at byte %d", ErrBadToken, i)
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Subject returns the subject of (tenant, model) in stream.
func Subject(stream, tenant, model string) string {
	return string(AppendSubject(make([]byte, 0, len(stream)+len(tenant)+len(model)+8), stream, tenant, model))
}

// AppendSubject appends the subject of (tenant, model) in stream to dst.
func AppendSubject(dst []byte, stream, tenant, model string) []byte {
	dst = append(dst, stream...)
	dst = append(dst, '.')
	dst = AppendToken(dst, tenant)
	dst = append(dst, '.')
	return AppendToken(dst, model)
}

// StreamSubjects is the subject filter a stream named stream is created
// with: exactly two tokens under its name.
func StreamSubjects(stream string) string { return stream + ".*.*" }

// ModelFilter is the filter subject consuming one (tenant, model) only.
func ModelFilter(stream, tenant, model string) string { return Subject(stream, tenant, model) }

// TenantFilter is the filter subject consuming every model of a tenant.
func TenantFilter(stream, tenant string) string {
	return string(AppendToken([]byte(stream+"."), tenant)) + ".*"
}

// ParseSubject returns the tenant and model of a subject of stream.
func ParseSubject(stream, subject string) (tenant, model string, err error) {
	rest, ok := strings.CutPrefix(subject, stream+".")
	if !ok {
		return "", "", fmt.Errorf("%w: %q", ErrBadSubject, subject)
	}
	t, m, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(m, ".") {
		return "", "", fmt.Errorf("%w: %q", ErrBadSubject, subject)
	}
	if tenant, err = DecodeToken(t); err != nil {
		return "", "", err
	}
	if model, err = DecodeToken(m); err != nil {
		return "", "", err
	}
	return tenant, model, nil
}

// ValidStreamName reports whether name can name a stream (and prefix its
// subjects): non-empty, at most 64 bytes, only [A-Za-z0-9_-].
func ValidStreamName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !plain(name[i]) {
			return false
		}
	}
	return true
}
