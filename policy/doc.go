// Package policy holds the cache policy the controller pushes to the server:
// the /policy wire schema (version 8: CachePolicies, CacheTenant quotas,
// and PDTopologies and PromptTemplates, pd.go), its decoding and
// per-version normalization, and the immutable, fully resolved Snapshot
// that the index and the handlers read on every call.
//
// Propagation is replace-on-write. The controller always sends the whole
// cluster's state; Store.Apply builds a new Snapshot from it and swaps it in
// with one atomic pointer store. Readers call Store.Load (one atomic load)
// and then Snapshot.Tenant (one read of an immutable map), so a policy push
// never blocks or slows a lookup, and a lookup never sees half a push.
//
// Tenant mapping: a CachePolicy applies to the tenant id equal to its
// namespace; a CacheTenant quota applies to its tenantID. Both land on the
// same resolved Tenant record keyed by that string.
package policy
