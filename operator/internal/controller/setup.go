// Package controller holds the inferencecache controllers:
//
//   - PolicyPropagator: CachePolicy + CacheTenant + PDTopology +
//     PromptTemplate -> /policy of every ready server pod, plus CachePolicy
//     status (Accepted / Conflicted / Invalid, Propagated, per-server
//     propagation) and PDTopology status (pool members, Ready);
//   - SnapshotPoller: the server's /snapshot -> CacheIndex cluster-default,
//     CacheTenant status, CacheBackend status.indexParticipation and the
//     tier-2 metrics.
//
// Both are single-key controllers driven by watch events and a timer; see
// their doc comments for the reconcile contract. The resolution rules live
// in resolve.go and project.go as pure functions.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// DefaultInterval is the default period of the policy push and the snapshot
// poll.
const DefaultInterval = 30 * time.Second

// conflictRetry is how soon a pass re-runs after a status write lost a
// resourceVersion race.
const conflictRetry = 500 * time.Millisecond

// passOutcome collects what the writes and calls of one reconcile pass
// returned and turns it into the pass's result, the same way for every
// controller here:
//
//   - a status write on an object deleted meanwhile (NotFound) is skipped;
//   - one on an object changed meanwhile (a resourceVersion conflict)
//     re-runs the pass after conflictRetry, without reporting an error: the
//     next pass reads the object again;
//   - any other error fails the pass, and the work queue retries it with
//     backoff (capped at the interval);
//   - otherwise the pass runs again after the interval.
//
// A failure on one object or kind does not stop the pass from writing the
// others.
type passOutcome struct {
	conflicted bool
	errs       []error
}

// wrote records the result of one status write.
func (o *passOutcome) wrote(err error) {
	switch {
	case err == nil, apierrors.IsNotFound(err):
	case apierrors.IsConflict(err):
		o.conflicted = true
	default:
		o.errs = append(o.errs, err)
	}
}

// fail records an error that fails the pass; nil is ignored.
func (o *passOutcome) fail(err error) {
	if err != nil {
		o.errs = append(o.errs, err)
	}
}

// result is the pass's reconcile result for a controller that runs every
// interval.
func (o *passOutcome) result(interval time.Duration) (reconcile.Result, error) {
	if err := errors.Join(o.errs...); err != nil {
		return reconcile.Result{}, err
	}
	if o.conflicted {
		return reconcile.Result{RequeueAfter: min(conflictRetry, interval)}, nil
	}
	return reconcile.Result{RequeueAfter: interval}, nil
}

// Options configures Setup.
type Options struct {
	// Server is the routing server client (required).
	Server *ServerClient
	// PushInterval and SnapshotInterval default to DefaultInterval.
	PushInterval     time.Duration
	SnapshotInterval time.Duration
	// DisableSnapshot leaves the SnapshotPoller out.
	DisableSnapshot bool
	// ServerService is the Service of the server pods: the policy is pushed
	// to every ready endpoint of its EndpointSlices. Empty means the Service
	// Server.BaseURL names (http://NAME.NAMESPACE.svc...); with neither, the
	// policy goes to Server.BaseURL only.
	ServerService types.NamespacedName
	// ServerPortName is the name of ServerService's port of the internal
	// listener. Empty means the name of the Service's port that
	// Server.BaseURL's port number targets (read on each pass), or
	// DefaultServerPortName when the Service cannot be read.
	ServerPortName string
	// DisableCacheBackend leaves the CacheBackend and PromptTemplate
	// reconcilers out; CacheBackend tunes them.
	DisableCacheBackend bool
	CacheBackend        CacheBackendOptions
	// CRDPollInterval is how often, while the CacheBackend or PromptTemplate
	// CRD is not installed, the leader checks whether it is now (default
	// DefaultCRDPollInterval); the reconcilers start once both are served.
	CRDPollInterval time.Duration
}

// DefaultCRDPollInterval is the default Options.CRDPollInterval.
const DefaultCRDPollInterval = 10 * time.Second

// Setup registers the PolicyPropagator and the SnapshotPoller with mgr.
//
// A kind whose CRD is served when Setup runs is watched through the
// manager's cache. A kind that is not served is not watched (a watch would
// fail the manager); it is listed live on every tick instead, quietly empty
// until its CRD is installed.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Server == nil {
		return errors.New("controller: Options.Server is required")
	}
	if o.PushInterval <= 0 {
		o.PushInterval = DefaultInterval
	}
	if o.SnapshotInterval <= 0 {
		o.SnapshotInterval = DefaultInterval
	}
	served := func(obj client.Object) bool {
		gvk, err := mgr.GetClient().GroupVersionKindFor(obj)
		if err != nil {
			return false
		}
		_, err = mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		return err == nil
	}
	reader := func(watched bool) client.Reader {
		if watched {
			return mgr.GetClient()
		}
		return mgr.GetAPIReader()
	}
	polServed := served(&v1alpha1.CachePolicy{})
	tenServed := served(&v1alpha1.CacheTenant{})
	idxServed := served(&v1alpha1.CacheIndex{})
	cbServed := served(&v1alpha1.CacheBackend{})
	pdtServed := served(&v1alpha1.PDTopology{})
	ptServed := served(&v1alpha1.PromptTemplate{})
	if !polServed || !tenServed || !idxServed || !cbServed || !pdtServed || !ptServed {
		mgr.GetLogger().Info("some inferencecache.io CRDs are not installed; those kinds are polled, not watched, until the next restart",
			"cachepolicies", polServed, "cachetenants", tenServed, "cacheindices", idxServed, "cachebackends", cbServed,
			"pdtopologies", pdtServed, "prompttemplates", ptServed)
	}

	prop := &PolicyPropagator{
		Policies:   reader(polServed),
		Tenants:    reader(tenServed),
		Topologies: reader(pdtServed),
		Templates:  reader(ptServed),
		Pods:       mgr.GetClient(), // metadata-only pod informer (PartialObjectMetadata)
		Status:     mgr.GetClient(),
		Server:     o.Server,
		Recorder:   mgr.GetEventRecorder("inferencecache-controller"),
		Interval:   o.PushInterval,
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("policy-propagation").
		WithOptions(singleKeyOptions(o.PushInterval)).
		WatchesRawSource(kick(PropagationKey))
	sw, err := serverSlices(mgr, o)
	if err != nil {
		return err
	}
	if sw.cache != nil {
		b = b.WatchesRawSource(source.Kind(sw.cache, &discoveryv1.EndpointSlice{},
			handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *discoveryv1.EndpointSlice) []reconcile.Request {
				return []reconcile.Request{PropagationKey}
			})))
	}
	prop.Servers = sw.discovery
	if polServed {
		b = b.Watches(&v1alpha1.CachePolicy{}, toKey(PropagationKey), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	if tenServed {
		b = b.Watches(&v1alpha1.CacheTenant{}, toKey(PropagationKey), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	if pdtServed {
		b = b.Watches(&v1alpha1.PDTopology{}, toKey(PropagationKey), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
		// A pod joining or leaving a pool changes its topology's members
		// and Ready condition: pods of namespaces with a PDTopology enqueue
		// the pass when created, deleted or relabelled.
		b = b.Watches(&corev1.Pod{}, podsOfTopologies(mgr.GetClient()),
			builder.OnlyMetadata, builder.WithPredicates(predicate.LabelChangedPredicate{}))
	}
	if ptServed {
		b = b.Watches(&v1alpha1.PromptTemplate{}, toKey(PropagationKey), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	if err := b.Complete(prop); err != nil {
		return fmt.Errorf("cannot set up the policy propagation controller: %w", err)
	}

	if !o.DisableCacheBackend {
		ready := func() bool { return served(&v1alpha1.CacheBackend{}) && served(&v1alpha1.PromptTemplate{}) }
		if !ready() {
			mgr.GetLogger().Info("the CacheBackend or PromptTemplate CRD is not installed; their reconcilers start once it is")
			if err := mgr.Add(&lateSetup{
				ready:    ready,
				setup:    func() error { return SetupCacheBackend(mgr, o.Server, o.CacheBackend) },
				interval: orDefault(o.CRDPollInterval, DefaultCRDPollInterval),
				log:      mgr.GetLogger(),
			}); err != nil {
				return fmt.Errorf("cannot add the CacheBackend CRD watch: %w", err)
			}
		} else if err := SetupCacheBackend(mgr, o.Server, o.CacheBackend); err != nil {
			return err
		}
	}
	if o.DisableSnapshot {
		return nil
	}
	m, err := registeredBackendMetrics()
	if err != nil {
		return fmt.Errorf("cannot register the backend metrics: %w", err)
	}
	poll := &SnapshotPoller{
		Index:    reader(idxServed),
		Tenants:  reader(tenServed),
		Backends: reader(cbServed),
		Pods:     mgr.GetClient(), // metadata-only pod informer (PartialObjectMetadata)
		Writer:   mgr.GetClient(),
		Server:   o.Server,
		Metrics:  m,
		Interval: o.SnapshotInterval,
	}
	b = ctrl.NewControllerManagedBy(mgr).
		Named("cache-snapshot").
		WithOptions(singleKeyOptions(o.SnapshotInterval)).
		WatchesRawSource(kick(SnapshotKey))
	if tenServed {
		b = b.Watches(&v1alpha1.CacheTenant{}, toKey(SnapshotKey), builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	if err := b.Complete(poll); err != nil {
		return fmt.Errorf("cannot set up the cache snapshot controller: %w", err)
	}
	return nil
}

// lateSetup is a manager Runnable (on the leader) that polls ready every
// interval and, the first time it reports true, runs setup (which adds
// controllers to the running manager; they start at once) and returns. It
// is how reconcilers whose CRD is installed after the controller started
// switch on without a restart.
type lateSetup struct {
	ready    func() bool
	setup    func() error
	interval time.Duration
	log      logr.Logger
}

// Start implements manager.Runnable; it blocks until setup ran or ctx is
// done. A setup error stops the manager, as it would have at start-up.
func (l *lateSetup) Start(ctx context.Context) error {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !l.ready() {
			continue
		}
		if err := l.setup(); err != nil {
			return err
		}
		l.log.Info("the CacheBackend and PromptTemplate CRDs are installed; their reconcilers started")
		return nil
	}
}

// discoveryProbeTimeout bounds Setup's check that the EndpointSlices of the
// server Service can be listed.
const discoveryProbeTimeout = 10 * time.Second

// sliceWatch is how the PolicyPropagator reads the server Service's
// EndpointSlices.
type sliceWatch struct {
	discovery ServerDiscovery
	// cache holds only the Service's EndpointSlices (its namespace, its
	// kubernetes.io/service-name label); nil when they are not watched.
	cache cache.Cache
}

// serverSlices sets up the reading of the server Service's EndpointSlices.
//
// Without a Service (none configured, and the server address names none)
// the policy goes to the address only. Otherwise Setup lists the slices once:
// when that works, a cache restricted to the Service's slices is added to
// the manager and watched, so a new ready server pod triggers a pass at
// once. When it fails (RBAC does not grant it, the apiserver did not answer)
// a watch would keep the controller from starting, so every pass lists the
// slices live instead, and pushes to the configured address while that
// fails.
func serverSlices(mgr ctrl.Manager, o Options) (sliceWatch, error) {
	svc := o.ServerService
	if svc.Name == "" {
		svc, _ = ServiceFromURL(o.Server.BaseURL)
	}
	if svc.Name == "" {
		return sliceWatch{}, nil
	}
	d := ServerDiscovery{Service: svc, PortName: o.ServerPortName, Services: mgr.GetAPIReader()}
	log := mgr.GetLogger().WithValues("service", nsName(svc))
	sel := client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}
	ctx, cancel := context.WithTimeout(context.Background(), discoveryProbeTimeout)
	defer cancel()
	if err := mgr.GetAPIReader().List(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(svc.Namespace), sel, client.Limit(1)); err != nil {
		log.Info("cannot list the server Service's EndpointSlices; not watching them, each push lists them again and falls back to the server address while that fails",
			"error", err.Error())
		d.Slices = mgr.GetAPIReader()
		return sliceWatch{discovery: d}, nil
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient:           mgr.GetHTTPClient(),
		Scheme:               mgr.GetScheme(),
		Mapper:               mgr.GetRESTMapper(),
		DefaultNamespaces:    map[string]cache.Config{svc.Namespace: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set(sel)),
	})
	if err != nil {
		return sliceWatch{}, fmt.Errorf("cannot create the EndpointSlice cache: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return sliceWatch{}, fmt.Errorf("cannot add the EndpointSlice cache: %w", err)
	}
	d.Slices = c
	return sliceWatch{discovery: d, cache: c}, nil
}

// singleKeyOptions: one worker, and failure backoff from 250 ms doubling up
// to the tick interval, so a failing server is retried quickly at first and
// never less often than the periodic tick.
func singleKeyOptions(interval time.Duration) controller.Options {
	return controller.Options{
		MaxConcurrentReconciles: 1,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](250*time.Millisecond, interval),
	}
}

// kick enqueues key once when the controller starts, so the first push and
// poll do not wait for an event.
func kick(key reconcile.Request) source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(key)
		return nil
	})
}

// toKey maps every event to key.
func toKey(key reconcile.Request) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
}

// podsOfTopologies maps a pod event to PropagationKey when the pod's
// namespace has a PDTopology (read from the cache).
func podsOfTopologies(c client.Reader) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var l v1alpha1.PDTopologyList
		if err := c.List(ctx, &l, client.InNamespace(obj.GetNamespace()), client.Limit(1)); err != nil || len(l.Items) == 0 {
			return nil
		}
		return []reconcile.Request{PropagationKey}
	})
}

// kindMissing reports whether err says the kind is not served (CRD not
// installed).
func kindMissing(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) && isKindNotFound(err)
}

// isKindNotFound distinguishes "the resource type is not served" (a 404 on
// a list) from a missing named object.
func isKindNotFound(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d == nil || d.Name == ""
}
