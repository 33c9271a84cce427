// Package v1alpha1 holds the inferencecache.io/v1alpha1 API: the declarative
// policy surface (CachePolicy, CacheTenant), the cache backend and prompt
// declarations (CacheBackend, PromptTemplate, PDTopology) and the
// cluster-scoped, status-only CacheIndex.
//
// The Go types are the source of truth; the CRD YAML under
// operator/config/crd/bases and zz_generated.deepcopy.go are generated from
// their +kubebuilder markers by hack/manifests.sh.
//
// +kubebuilder:object:generate=true
// +groupName=inferencecache.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "inferencecache.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
