// Package chartcheck keeps the Helm chart charts/inferencecache and the
// kustomize sources in operator/config one source of truth: its tests
// render both (the Helm SDK, the kustomize library) and compare the
// objects, keep the chart's copies of generated manifests and its README
// values table in sync (-rewrite), check values.schema.json against
// values.yaml, and lint the chart. It is a module of its own so the Helm
// SDK stays out of the main module; `go tool helm` runs the Helm CLI of
// the same version.
package chartcheck
