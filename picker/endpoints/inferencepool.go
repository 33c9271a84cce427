package endpoints

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// Annotations of an InferencePool that the InferencePool source reads.
const (
	// HashSchemeAnnotation sets the pool's hash scheme (default
	// DefaultHashScheme): the --hash-scheme of its kvevent subscribers.
	HashSchemeAnnotation = "inferencecache.io/hash-scheme"
	// ModelsAnnotation maps request model names to index scopes: a JSON
	// (or YAML) list of {"name", "modelId", "adapterId"}, the models list
	// of the endpoints file. A name it lacks resolves to itself.
	ModelsAnnotation = "inferencecache.io/models"
)

// ErrNoInferencePoolKind says the apiserver does not serve
// inference.networking.k8s.io/v1 InferencePool.
var ErrNoInferencePoolKind = errors.New("endpoints: the apiserver does not serve inference.networking.k8s.io/v1 InferencePool (install the Gateway API Inference Extension CRDs)")

// Timing of the InferencePool source.
const (
	// checkTimeout bounds each start-up check request.
	checkTimeout = 15 * time.Second
	// syncWarnAfter is how long a cache may take to sync before each
	// warning that it has not.
	syncWarnAfter = 30 * time.Second
	// maxRetry caps the backoff of retried start-up checks and rebuilds.
	maxRetry = 30 * time.Second
)

// InferencePoolConfig names the InferencePool to follow.
type InferencePoolConfig struct {
	// REST reaches the apiserver (controller-runtime's ctrl.GetConfig():
	// in-cluster, or the kubeconfig).
	REST *rest.Config
	// Pool is the InferencePool's namespace and name.
	Pool types.NamespacedName
}

// ParsePoolRef parses "NAMESPACE/NAME" (the --inference-pool flag).
func ParsePoolRef(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	ref := types.NamespacedName{Namespace: ns, Name: name}
	if !ok {
		return ref, fmt.Errorf("cannot parse InferencePool %q: want NAMESPACE/NAME", s)
	}
	return ref, validateRef(ref)
}

func validateRef(ref types.NamespacedName) error {
	if errs := validation.IsDNS1123Label(ref.Namespace); len(errs) > 0 {
		return fmt.Errorf("invalid InferencePool namespace %q: %s", ref.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(ref.Name); len(errs) > 0 {
		return fmt.Errorf("invalid InferencePool name %q: %s", ref.Name, strings.Join(errs, "; "))
	}
	return nil
}

// ReplicaID is the replica id of the endpoint of target port rank of a pod
// in a pool with ranks target ports: the pod name when ranks is 1, else
// "<pod>-dp<rank>" (one port per data-parallel rank, each rank with a
// kvevent subscriber of its own).
func ReplicaID(pod string, rank, ranks int) string {
	if ranks <= 1 {
		return pod
	}
	return pod + "-dp" + strconv.Itoa(rank)
}

// InferencePool is a Source that follows one InferencePool and the Ready
// pods its selector picks, through controller-runtime caches limited to the
// pool's namespace (see the package doc for the rules). It is safe for
// concurrent use.
type InferencePool struct {
	ref    types.NamespacedName
	rest   *rest.Config
	o      options
	log    limitedLog
	scheme *runtime.Scheme
	http   *http.Client
	mapper meta.RESTMapper

	// pool is the current pool: stored by the Run goroutine, loaded by
	// Pool from any goroutine.
	pool atomic.Pointer[Pool]
	// synced is closed by the Run goroutine at the first publish.
	synced chan struct{}
	// running is set by the first call of Run.
	running atomic.Bool

	// Run goroutine only:
	// isSynced says synced is closed.
	isSynced bool
	// goodModels is the model map of the last valid models annotation of
	// the pool (nil: none yet); badModels is the last annotation value
	// that failed, so a bad value is reported once, not on every rebuild.
	goodModels map[string]Model
	badModels  string
	// badSelector is the last selector that failed validation, reported
	// once.
	badSelector string
	// missing says the last rebuild found no InferencePool (logged once
	// per absence).
	missing bool
}

// NewInferencePool makes a source for the pool cfg names; it does no I/O
// (Run checks access first). Options: WithObserver, WithLogger.
func NewInferencePool(cfg InferencePoolConfig, opts ...Option) (*InferencePool, error) {
	if cfg.REST == nil {
		return nil, errors.New("cannot follow an InferencePool: no REST config")
	}
	if err := validateRef(cfg.Pool); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("cannot register core/v1: %w", err)
	}
	if err := giev1.Install(scheme); err != nil {
		return nil, fmt.Errorf("cannot register %s: %w", giev1.GroupVersion, err)
	}
	hc, err := rest.HTTPClientFor(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("cannot make the Kubernetes HTTP client: %w", err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg.REST, hc)
	if err != nil {
		return nil, fmt.Errorf("cannot make the Kubernetes REST mapper: %w", err)
	}
	s := &InferencePool{
		ref: cfg.Pool, rest: cfg.REST, o: makeOptions(opts),
		scheme: scheme, http: hc, mapper: mapper,
		synced: make(chan struct{}),
	}
	s.log.log = s.o.log.With("inferencePool", cfg.Pool.String())
	return s, nil
}

// Pool implements Source: nil until Synced is closed.
func (s *InferencePool) Pool() *Pool { return s.pool.Load() }

// Synced implements Source: closed once the pool and its pods have been
// listed (an InferencePool that does not exist is known: no endpoints).
func (s *InferencePool) Synced() <-chan struct{} { return s.synced }

// Run implements Source. It first checks that the pool and the pods of its
// namespace can be listed: it returns an error when RBAC refuses it (the
// error says what to grant) or the InferencePool kind is not served, and
// retries other failures (the apiserver not reachable yet) until ctx ends.
// Then it follows the pool until ctx ends and returns nil.
func (s *InferencePool) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := s.check(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	kick := make(chan struct{}, 1)
	notify := func() {
		select {
		case kick <- struct{}{}:
		default: // a rebuild is pending already; it will see this change
		}
	}
	pools, err := s.newCache(cache.Options{ByObject: map[client.Object]cache.ByObject{
		&giev1.InferencePool{}: {
			Field:     fields.OneTermEqualSelector("metadata.name", s.ref.Name),
			Transform: cache.TransformStripManagedFields(),
		},
	}})
	if err != nil {
		cancel()
		return err
	}
	poolsDone := start(ctx, pools)
	var pods *podWatch
	defer func() {
		cancel()
		pods.stop()
		<-poolsDone
	}()
	if err := s.follow(ctx, pools, &giev1.InferencePool{}, "InferencePool", notify); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Second
	notify()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-retry.C:
		}
		var err error
		if pods, err = s.rebuild(ctx, pools, pods, notify); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.warn("cannot rebuild the endpoints; keeping the last pool", "error", err, "retryIn", backoff)
			retry.Reset(backoff)
			backoff = min(2*backoff, maxRetry)
			continue
		}
		backoff = time.Second
	}
}

// check lists the pool and the namespace's pods once, so missing RBAC or a
// missing CRD is an error at start instead of a cache that never syncs.
func (s *InferencePool) check(ctx context.Context) error {
	c, err := client.New(s.rest, client.Options{HTTPClient: s.http, Scheme: s.scheme, Mapper: s.mapper})
	if err != nil {
		return fmt.Errorf("cannot make the Kubernetes client: %w", err)
	}
	backoff := time.Second
	for {
		err := s.checkOnce(ctx, c)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || errors.Is(err, ErrNoInferencePoolKind) {
			return err
		}
		s.log.warn("cannot reach the Kubernetes API yet; retrying", "error", err, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRetry)
	}
}

func (s *InferencePool) checkOnce(ctx context.Context, c client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	ns := client.InNamespace(s.ref.Namespace)
	err := c.List(ctx, &giev1.InferencePoolList{}, ns, client.Limit(1),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", s.ref.Name)})
	if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %w", ErrNoInferencePoolKind, err)
	}
	if err != nil {
		return fmt.Errorf("cannot list InferencePools in namespace %q (grant list, watch on inferencepools.inference.networking.k8s.io there): %w", s.ref.Namespace, err)
	}
	if err := c.List(ctx, &corev1.PodList{}, ns, client.Limit(1)); err != nil {
		return fmt.Errorf("cannot list pods in namespace %q (grant list, watch on pods there): %w", s.ref.Namespace, err)
	}
	return nil
}

// newCache makes a cache of the pool's namespace with o's ByObject.
func (s *InferencePool) newCache(o cache.Options) (cache.Cache, error) {
	o.HTTPClient, o.Scheme, o.Mapper = s.http, s.scheme, s.mapper
	o.DefaultNamespaces = map[string]cache.Config{s.ref.Namespace: {}}
	o.DefaultWatchErrorHandler = s.watchError
	o.ReaderFailOnMissingInformer = true // read only what follow watches
	c, err := cache.New(s.rest, o)
	if err != nil {
		return nil, fmt.Errorf("cannot make a cache of namespace %q: %w", s.ref.Namespace, err)
	}
	return c, nil
}

// start runs c until ctx ends; the channel is closed when it has stopped.
func start(ctx context.Context, c cache.Cache) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Start(ctx) // it fails only if started twice
	}()
	return done
}

// follow makes c watch obj's kind, calling notify on every event, and
// waits until the cache is synced, warning while it is not. It returns
// ctx's error if ctx ends first.
func (s *InferencePool) follow(ctx context.Context, c cache.Cache, obj client.Object, what string, notify func()) error {
	inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("cannot watch %s: %w", what, err)
	}
	on := func(any) { notify() }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: on, DeleteFunc: on, UpdateFunc: func(any, any) { notify() },
	}); err != nil {
		return fmt.Errorf("cannot watch %s: %w", what, err)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, syncWarnAfter)
		ok := c.WaitForCacheSync(wctx)
		cancel()
		if ok {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.warn("the cache has not synced yet; still waiting", "kind", what, "waited", syncWarnAfter)
	}
}

// watchError is the caches' list-and-watch error handler (called from
// reflector goroutines): routine watch ends are ignored, failures logged
// (rate-limited) and counted; the reflector retries with backoff.
func (s *InferencePool) watchError(_ context.Context, r *toolscache.Reflector, err error) {
	if err == io.EOF || err == io.ErrUnexpectedEOF || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	s.o.observer.ReloadFailed(ReasonWatch)
	s.log.warn("Kubernetes list or watch failed; retrying", "watch", r.TypeDescription(), "error", err)
}

// podWatch is a cache of the pods one selector picks.
type podWatch struct {
	selector string // labels.Selector.String() of the cache's selector
	cache    cache.Cache
	cancel   context.CancelFunc
	done     <-chan struct{} // closed when the cache has stopped
}

// stop stops the cache and waits for it; a nil podWatch is stopped.
func (w *podWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// watchPods starts a pod cache limited to sel and waits for its sync.
func (s *InferencePool) watchPods(ctx context.Context, sel labels.Selector, notify func()) (*podWatch, error) {
	noCopy := true
	c, err := s.newCache(cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {
			Label:     sel,
			Transform: slimPod,
			// List hands out the cached pods: rebuild only reads them.
			UnsafeDisableDeepCopy: &noCopy,
		},
	}})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &podWatch{selector: sel.String(), cache: c, cancel: cancel, done: start(wctx, c)}
	if err := s.follow(wctx, c, &corev1.Pod{}, "Pod", notify); err != nil {
		w.stop()
		return nil, err
	}
	return w, nil
}

// rebuild reads the pool and its pods from the caches and publishes the
// pool they make; it returns the pod watch to keep (a new one when the
// selector changed, nil when there is no pool or no valid selector).
func (s *InferencePool) rebuild(ctx context.Context, pools cache.Cache, pods *podWatch, notify func()) (*podWatch, error) {
	ns := s.ref.Namespace
	var ip giev1.InferencePool
	if err := pools.Get(ctx, s.ref, &ip); apierrors.IsNotFound(err) {
		pods.stop()
		s.goodModels, s.badModels, s.badSelector = nil, "", ""
		if !s.missing {
			s.missing = true
			s.log.log.Info("the InferencePool does not exist; no endpoints until it does")
		}
		empty, err := NewPool(ns, "", nil, nil)
		if err != nil {
			panic("BUG: the empty pool is invalid: " + err.Error())
		}
		s.publish(empty)
		return nil, nil
	} else if err != nil {
		return pods, fmt.Errorf("cannot read the InferencePool from its cache: %w", err)
	}

	if s.missing {
		s.missing = false
		s.log.log.Info("the InferencePool exists")
	}
	hashScheme := strings.TrimSpace(ip.Annotations[HashSchemeAnnotation])
	models := s.models(ip.Annotations)
	var eps []Endpoint
	if sel := s.selector(&ip); sel == nil {
		pods.stop()
		pods = nil
	} else {
		if pods == nil || pods.selector != sel.String() {
			// The selector is the pool's identity and rarely changes: a
			// new cache (memory proportional to the pool, not the
			// namespace) is cheaper than watching every pod. The old pool
			// stays published until the new cache has synced.
			np, err := s.watchPods(ctx, sel, notify)
			if err != nil {
				return pods, err
			}
			pods.stop()
			pods = np
		}
		var list corev1.PodList
		if err := pods.cache.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return pods, fmt.Errorf("cannot list pods from the cache: %w", err)
		}
		var dups []string
		eps, dups = podEndpoints(list.Items, ip.Spec.TargetPorts)
		if len(dups) > 0 {
			s.log.warn("pods share an address; each address goes to the first pod by name", "dropped", dups)
		}
	}
	p, err := NewPool(ns, hashScheme, models, eps)
	if err != nil {
		return pods, fmt.Errorf("cannot make the pool: %w", err)
	}
	s.publish(p)
	return pods, nil
}

// models returns the model map of the pool's ModelsAnnotation; an invalid
// one is reported once and the last valid one stays in use.
func (s *InferencePool) models(ann map[string]string) map[string]Model {
	raw := ann[ModelsAnnotation]
	if strings.TrimSpace(raw) == "" {
		s.goodModels, s.badModels = nil, ""
		return nil
	}
	m, err := decodeModels([]byte(raw))
	if err != nil {
		if raw != s.badModels {
			s.badModels = raw
			s.o.observer.ReloadFailed(ReasonInvalid)
			s.log.warn("invalid "+ModelsAnnotation+" annotation; keeping the last valid model map", "error", err)
		}
		return s.goodModels
	}
	s.goodModels, s.badModels = m, ""
	return m
}

// selector returns the pool's pod selector, or nil when it selects no pod:
// empty (as a Service's empty selector, it does not mean "every pod") or
// invalid (reported once).
func (s *InferencePool) selector(ip *giev1.InferencePool) labels.Selector {
	set := make(labels.Set, len(ip.Spec.Selector.MatchLabels))
	for k, v := range ip.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	if len(set) == 0 {
		return nil
	}
	sel, err := labels.ValidatedSelectorFromSet(set)
	if err != nil {
		if key := set.String(); key != s.badSelector {
			s.badSelector = key
			s.o.observer.ReloadFailed(ReasonInvalid)
			s.log.warn("invalid InferencePool selector; selecting no pods", "error", err)
		}
		return nil
	}
	s.badSelector = ""
	return sel
}

// publish swaps p in if it differs from the current pool. Run goroutine
// only.
func (s *InferencePool) publish(p *Pool) {
	if old := s.pool.Load(); old != nil && old.Equal(p) {
		return
	}
	s.pool.Store(p)
	s.o.observer.PoolChanged(p.Len())
	if !s.isSynced {
		s.isSynced = true
		close(s.synced)
		s.log.log.Info("InferencePool endpoints known", "endpoints", p.Len(), "hashScheme", p.HashScheme)
		return
	}
	s.log.log.Debug("InferencePool endpoints changed", "endpoints", p.Len())
}

// podReady reports whether a pod takes traffic: its PodReady condition is
// True, it is not being deleted, and it has an IP.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podEndpoints returns the endpoints of the Ready pods, one per target
// port (replica ids by ReplicaID), and the "pod address" pairs dropped
// because an earlier pod by name has the address (hostNetwork pods on one
// node).
func podEndpoints(pods []corev1.Pod, ports []giev1.Port) (eps []Endpoint, dups []string) {
	ready := make([]*corev1.Pod, 0, len(pods))
	for i := range pods {
		if podReady(&pods[i]) {
			ready = append(ready, &pods[i])
		}
	}
	// By name, so the owner of a shared address does not depend on the
	// cache's order (pointers: a Pod is too large to move around).
	slices.SortFunc(ready, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	eps = make([]Endpoint, 0, len(ready)*len(ports))
	seen := make(map[netip.AddrPort]struct{}, len(ready)*len(ports))
	for _, p := range ready {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			continue // the apiserver validates podIP; nothing to route to
		}
		for r, port := range ports {
			if port.Number < 1 || port.Number > 65535 {
				continue // the CRD forbids it
			}
			ap := netip.AddrPortFrom(ip.Unmap(), uint16(port.Number))
			if _, dup := seen[ap]; dup {
				dups = append(dups, p.Name+" "+ap.String())
				continue
			}
			seen[ap] = struct{}{}
			eps = append(eps, Endpoint{ReplicaID: ReplicaID(p.Name, r, len(ports)), Address: ap.String()})
		}
	}
	return eps, dups
}

// slimPod is the pod cache's transform: it keeps only what podEndpoints
// and the informer read (name, namespace, uid, resource version, labels,
// deletion timestamp, pod IP, the Ready condition's status), so the cache
// does not hold every pod's spec and full status.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	s := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{PodIP: p.Status.PodIP},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			s.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	return s, nil
}
