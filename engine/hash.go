package engine

import "github.com/zeebo/xxh3"

func hashBytes(b []byte, seed uint64) uint64 { return xxh3.HashSeed(b, seed) }
