package main

import (
	"errors"
	"fmt"
	"log/slog"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/server"
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

// newEndpointSource checks the picker's source flags and returns the
// constructor of the source they name: nil when neither is set (the picker
// then stays off), an error when both are or the one set is malformed. The
// server calls the constructor with its metrics; the one place the sources
// are constructed.
func newEndpointSource(f endpointFlags) (server.NewEndpointSource, error) {
	switch {
	case f.inferencePool != "" && f.endpointsFile != "":
		return nil, errors.New("--inference-pool and --endpoints-file exclude each other")
	case f.inferencePool != "":
		ref, err := endpoints.ParsePoolRef(f.inferencePool)
		if err != nil {
			return nil, fmt.Errorf("--inference-pool: %w", err)
		}
		kubeconfig := f.kubeconfig
		return func(obs endpoints.Observer, log *slog.Logger) (endpoints.Source, error) {
			rest, err := restConfig(kubeconfig)
			if err != nil {
				return nil, fmt.Errorf("--inference-pool %s: %w", ref, err)
			}
			return endpoints.NewInferencePool(endpoints.InferencePoolConfig{REST: rest, Pool: ref},
				endpoints.WithObserver(obs), endpoints.WithLogger(log))
		}, nil
	case f.endpointsFile != "":
		path := f.endpointsFile
		return func(obs endpoints.Observer, log *slog.Logger) (endpoints.Source, error) {
			return endpoints.NewFile(path, endpoints.WithObserver(obs), endpoints.WithLogger(log))
		}, nil
	}
	return nil, nil
}

// restConfig is the Kubernetes client configuration: --kubeconfig, or the
// in-cluster (or $KUBECONFIG) one when it is empty.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("cannot load --kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := ctrlconfig.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("cannot find the Kubernetes API (in-cluster or $KUBECONFIG): %w", err)
	}
	return c, nil
}
