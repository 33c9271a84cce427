package fingerprint

import "github.com/zeebo/xxh3"

func hashBytes(b []byte) uint64 { return xxh3.HashSeed(b, Seed) }
