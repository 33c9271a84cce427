package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/inferencecache/inferencecache/picker/endpoints"
)

// endpointFlags are the endpoint picker's source flags.
type endpointFlags struct {
	// inferencePool is NAMESPACE/NAME of an InferencePool
	// (inference.networking.k8s.io/v1) whose Ready pods are the endpoints.
	inferencePool string
	// endpointsFile is a static endpoint file, reloaded when it changes.
	endpointsFile string
	// kubeconfig is --kubeconfig (empty: in-cluster).
	kubeconfig string
}

// errSourceUnavailable: the flag is known, but this build has no such
// source yet (it fails startup rather than run a picker without
// endpoints).
var errSourceUnavailable = errors.New("endpoint source not available in this build")

// newEndpointSource builds the picker's endpoint source from the flags: nil
// when neither is set (the picker then stays off), an error when both are
// or the one set is malformed or unavailable. The one place the sources
// are constructed.
func newEndpointSource(f endpointFlags) (endpoints.Source, error) {
	switch {
	case f.inferencePool != "" && f.endpointsFile != "":
		return nil, errors.New("--inference-pool and --endpoints-file exclude each other")
	case f.inferencePool != "":
		ns, name, ok := strings.Cut(f.inferencePool, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--inference-pool must be NAMESPACE/NAME, got %q", f.inferencePool)
		}
		// endpoints.NewInferencePool(ns, name, f.kubeconfig) at merge.
		return nil, fmt.Errorf("--inference-pool %s/%s: %w (needs endpoints.NewInferencePool)", ns, name, errSourceUnavailable)
	case f.endpointsFile != "":
		// endpoints.NewFile(f.endpointsFile) at merge.
		return nil, fmt.Errorf("--endpoints-file %s: %w (needs endpoints.NewFile)", f.endpointsFile, errSourceUnavailable)
	}
	return nil, nil
}
