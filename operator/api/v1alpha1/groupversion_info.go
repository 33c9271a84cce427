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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "inferencecache.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// knownTypes is filled by the init functions of the *_types.go files, before
// any AddToScheme call can run.
var knownTypes []runtime.Object

func register(objs ...runtime.Object) { knownTypes = append(knownTypes, objs...) }

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
