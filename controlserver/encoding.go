package controlserver

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Content codings /snapshot can answer with.
const (
	encodingZstd     = "zstd"
	encodingGzip     = "gzip"
	encodingIdentity = "identity"
)

// negotiateEncoding picks the response coding from the Accept-Encoding
// values: the acceptable (q > 0) one of zstd and gzip with the higher q, zstd
// on a tie; identity when neither is acceptable. "*" stands for any coding
// not listed; "x-gzip" is gzip. Malformed q values make that coding
// unacceptable. The snapshot is always served: identity is the fallback even
// when the client marks it q=0 (no 406).
func negotiateEncoding(values []string) string {
	q := map[string]float64{}
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			name, params, _ := strings.Cut(part, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			if name == "x-gzip" {
				name = encodingGzip
			}
			weight := 1.0
			for p := range strings.SplitSeq(params, ";") {
				k, val, ok := strings.Cut(p, "=")
				if !ok || !strings.EqualFold(strings.TrimSpace(k), "q") {
					continue
				}
				f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
				if err != nil || f < 0 || f > 1 {
					f = 0
				}
				weight = f
			}
			if old, seen := q[name]; !seen || weight > old {
				q[name] = weight
			}
		}
	}
	accept := func(c string) float64 {
		if w, ok := q[c]; ok {
			return w
		}
		return q["*"] // 0 when absent
	}
	z, g := accept(encodingZstd), accept(encodingGzip)
	switch {
	case z > 0 && z >= g:
		return encodingZstd
	case g > 0:
		return encodingGzip
	}
	return encodingIdentity
}

// Encoder pools. A pooled encoder holds no reference to a response writer
// (it is Reset to nil before Put). zstd encoders run synchronously
// (concurrency 1), so a dropped one leaks no goroutine.
var (
	gzipPool = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.DefaultCompression) // the level is valid: no error
		return w
	}}
	zstdPool = sync.Pool{New: func() any {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
		if err != nil {
			panic("BUG: controlserver: zstd options rejected: " + err.Error())
		}
		return e
	}}
)

// writeEncoded writes data with the chosen coding, setting Content-Encoding
// (or Content-Length for identity) before the first byte.
func writeEncoded(w http.ResponseWriter, coding string, data []byte) error {
	switch coding {
	case encodingZstd:
		w.Header().Set("Content-Encoding", encodingZstd)
		enc := zstdPool.Get().(*zstd.Encoder)
		defer func() {
			enc.Reset(nil)
			zstdPool.Put(enc)
		}()
		enc.Reset(w)
		if _, err := enc.Write(data); err != nil {
			return err
		}
		return enc.Close()
	case encodingGzip:
		w.Header().Set("Content-Encoding", encodingGzip)
		enc := gzipPool.Get().(*gzip.Writer)
		defer func() {
			enc.Reset(nil)
			gzipPool.Put(enc)
		}()
		enc.Reset(w)
		if _, err := enc.Write(data); err != nil {
			return err
		}
		return enc.Close()
	default:
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, err := w.Write(data)
		return err
	}
}
