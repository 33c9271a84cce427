// Package webhook holds the validating admission webhooks of the
// inferencecache.io kinds (CachePolicy, CacheTenant, CacheBackend,
// PDTopology, PromptTemplate) and the mutating pod webhook that wires engine pods to their
// CacheBackend (PodInjector, which fails open).
//
// Field rules come from package validation. The cross-object rules (one
// CachePolicy per namespace; a tenantID unique within its namespace) list the
// namespace through a live, uncached reader. They are best effort — two
// concurrent CREATEs can both pass — and the controller's deterministic
// tie-break is the backstop. A missing reader or a failed list refuses the
// request (fail closed), matching failurePolicy: Fail.
//
// UPDATE refuses only the violations the update introduces
// (validation.Introduced), so objects admitted under looser rules stay
// editable: a bad value may be kept as it is, but a field the update
// changes must become valid. DELETE is never refused.
package webhook

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// ErrNoReader is returned (and the request refused) when a validator that
// must list sibling objects has no reader.
var ErrNoReader = errors.New("webhook: no API reader configured; refusing admission (fail closed)")

// Options configures the validating webhooks.
type Options struct {
	// BackendPolicy is what CacheBackends may ask the controller to run
	// (images, ServiceAccounts); the zero value allows anything.
	BackendPolicy validation.BackendPolicy
}

// Setup registers the five validating webhooks with mgr's webhook server.
// reader lists sibling objects; pass mgr.GetAPIReader() for live reads.
func Setup(mgr ctrl.Manager, reader client.Reader, o Options) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.CachePolicy{}).
		WithValidator(&CachePolicyValidator{Reader: reader}).Complete(); err != nil {
		return err
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.CacheTenant{}).
		WithValidator(&CacheTenantValidator{Reader: reader}).Complete(); err != nil {
		return err
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.CacheBackend{}).
		WithValidator(&CacheBackendValidator{Policy: o.BackendPolicy}).Complete(); err != nil {
		return err
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.PDTopology{}).
		WithValidator(&PDTopologyValidator{}).Complete(); err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.PromptTemplate{}).
		WithValidator(&PromptTemplateValidator{}).Complete()
}

// PodInjectionPath is the path of the mutating pod webhook.
const PodInjectionPath = "/mutate--v1-pod"

// SetupPodInjection registers the mutating pod webhook (PodInjector) with
// mgr's webhook server. reader lists CacheBackends; the manager's cached
// client is enough (a backend created a moment ago may miss the pods
// admitted in that moment, which then run uninjected).
func SetupPodInjection(mgr ctrl.Manager, reader client.Reader, o PodInjectorOptions) {
	mgr.GetWebhookServer().Register(PodInjectionPath, &webhook.Admission{Handler: &PodInjector{
		Reader: reader, Decoder: admission.NewDecoder(mgr.GetScheme()), Options: o,
		Recorder: mgr.GetEventRecorder("inferencecache-pod-webhook"),
	}})
}

// invalid turns a non-empty error list into the apiserver's 422 Invalid
// status, whose message lists every field error.
func invalid(kind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: kind}, name, errs)
}
