package bus

import "github.com/inferencecache/inferencecache/internal/ratelog"

// unknownKindLog rate-limits the WARN about stream messages without a known
// kind header, which anyone who can publish on the stream's subjects can
// send one per message: one line per 10 s (the zero Limiter), each counting
// those held back; inferencecache_bus_messages_total{kind="unknown"}
// counts every one. Shared by the process's consumers.
var unknownKindLog ratelog.Limiter
