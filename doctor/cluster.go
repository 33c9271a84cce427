package doctor

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

// InjectedByAnnotation is the engine pod annotation, "<namespace>/<name>",
// naming the CacheBackend whose injection the pod carries. It mirrors the
// operator's controller.InjectedByAnnotation (internal to the operator).
const InjectedByAnnotation = "inferencecache.io/injected-by"

// quotaWarnFraction is the share of maxIndexEntries from which a tenant is
// reported near its quota.
const quotaWarnFraction = 0.9

// clusterState is what fetchCluster read; evaluate turns it into findings.
type clusterState struct {
	o *Options

	// Nil slices with a false *OK mean the list failed (already reported).
	backends   []v1alpha1.CacheBackend
	backendsOK bool
	tenants    []v1alpha1.CacheTenant
	tenantsOK  bool
	policies   []v1alpha1.CachePolicy
	policiesOK bool
	// index is the controller's CacheIndex; indexOK says the list worked.
	index   *v1alpha1.CacheIndex
	indexOK bool
	pods    []metav1.PartialObjectMetadata
	podsOK  bool
	// nsAnnotations are the annotations of every Namespace, by name: their
	// consent to cross-namespace claims (claim.AllowClaimsFromAnnotation).
	// Read only over all namespaces and when a backend sets
	// allowCrossNamespace; namespacesOK says they were, so cross-namespace
	// claims are judged.
	nsAnnotations map[string]map[string]string
	namespacesOK  bool
	// remoteBackends records, for injected-by keys outside Options.Namespace,
	// whether the backend exists.
	remoteBackends map[string]bool
}

// listErr classifies a list/get error. It returns fatal=true when the
// apiserver itself is unusable (reported once as IC200).
func (c *clusterState) listErr(what string, err error, fs *findings) (fatal bool) {
	switch {
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		fs.add(CodeCRDs, Fail, what, "CRD not installed: %s", oneLine(err))
	case apierrors.IsForbidden(err):
		fs.add(CodeForbidden, Warn, what, "cannot list: %s; its checks were skipped", oneLine(err))
	default:
		fs.add(CodeClusterAPI, Fail, c.o.ClusterHost, "cannot list %s: %s", what, oneLine(err))
		return true
	}
	return false
}

// fetchCluster reads everything the cluster checks need. It returns nil when
// the cluster is not checked or unusable.
func fetchCluster(ctx context.Context, o *Options, fs *findings) *clusterState {
	if o.ClusterErr != nil {
		fs.add(CodeClusterAPI, Fail, o.ClusterHost, "no usable cluster configuration: %s", oneLine(o.ClusterErr))
		return nil
	}
	if o.Cluster == nil {
		return nil
	}
	c := &clusterState{o: o, remoteBackends: map[string]bool{}}
	var nsOpt []client.ListOption
	if o.Namespace != "" {
		nsOpt = append(nsOpt, client.InNamespace(o.Namespace))
	}
	crdsOK := true // every CRD verified by a successful list
	lists := []struct {
		what string
		list client.ObjectList
		opts []client.ListOption
		ok   *bool
	}{
		{"cachebackends.inferencecache.io", &v1alpha1.CacheBackendList{}, nsOpt, &c.backendsOK},
		{"cachetenants.inferencecache.io", &v1alpha1.CacheTenantList{}, nsOpt, &c.tenantsOK},
		{"cachepolicies.inferencecache.io", &v1alpha1.CachePolicyList{}, nsOpt, &c.policiesOK},
		{"cacheindices.inferencecache.io", &v1alpha1.CacheIndexList{}, nil, &c.indexOK},
		{"prompttemplates.inferencecache.io", &v1alpha1.PromptTemplateList{}, append([]client.ListOption{client.Limit(1)}, nsOpt...), nil},
		{"pdtopologies.inferencecache.io", &v1alpha1.PDTopologyList{}, append([]client.ListOption{client.Limit(1)}, nsOpt...), nil},
	}
	for _, l := range lists {
		if err := o.Cluster.List(ctx, l.list, l.opts...); err != nil {
			if c.listErr(l.what, err, fs) {
				return nil
			}
			crdsOK = false // missing (IC201 FAIL) or unverified (IC202)
			continue
		}
		if l.ok != nil {
			*l.ok = true
		}
		switch l := l.list.(type) {
		case *v1alpha1.CacheBackendList:
			c.backends = l.Items
		case *v1alpha1.CacheTenantList:
			c.tenants = l.Items
		case *v1alpha1.CachePolicyList:
			c.policies = l.Items
		case *v1alpha1.CacheIndexList:
			for i := range l.Items {
				if l.Items[i].Name == v1alpha1.CacheIndexName {
					c.index = &l.Items[i]
				}
			}
		}
	}
	fs.add(CodeClusterAPI, OK, o.ClusterHost, "reachable")
	if crdsOK {
		fs.add(CodeCRDs, OK, "", "%d inferencecache.io CRDs installed", len(lists))
	}

	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := o.Cluster.List(ctx, pods, nsOpt...); err != nil {
		if c.listErr("pods", err, fs) {
			return nil
		}
	} else {
		c.pods, c.podsOK = pods.Items, true
	}

	// Cross-namespace claims need the pods' Namespaces (their consent), and
	// every namespace's pods and backends: only a run over all namespaces
	// judges them.
	if c.podsOK && c.backendsOK && o.Namespace == "" && slices.ContainsFunc(c.backends, func(b v1alpha1.CacheBackend) bool { return b.Spec.AllowCrossNamespace }) {
		nss := &metav1.PartialObjectMetadataList{}
		nss.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
		if err := o.Cluster.List(ctx, nss); err != nil {
			if c.listErr("namespaces", err, fs) {
				return nil
			}
		} else {
			c.nsAnnotations = make(map[string]map[string]string, len(nss.Items))
			for _, n := range nss.Items {
				c.nsAnnotations[n.Name] = n.Annotations
			}
			c.namespacesOK = true
		}
	}

	if o.Controller != nil {
		checkController(ctx, o, fs)
	}

	// Resolve injected-by keys outside the listed scope with a Get each.
	if c.podsOK && c.backendsOK && o.Namespace != "" {
		tried := map[string]bool{}
		for _, p := range c.pods {
			key := strings.TrimSpace(p.Annotations[InjectedByAnnotation])
			ns, name, ok := strings.Cut(key, "/")
			if !ok || ns == "" || name == "" || ns == o.Namespace || tried[key] {
				continue // malformed keys are reported by checkOrphans
			}
			tried[key] = true
			err := o.Cluster.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.CacheBackend{})
			switch {
			case err == nil:
				c.remoteBackends[key] = true
			case apierrors.IsNotFound(err):
				c.remoteBackends[key] = false
			default:
				fs.add(CodeForbidden, Warn, "cachebackend "+key, "cannot get: %s; orphan check skipped for it", oneLine(err))
			}
		}
	}
	return c
}

// evaluate checks the fetched objects; snap is the live /snapshot or nil.
func (c *clusterState) evaluate(snap *controlapi.CacheSnapshot, fs *findings) {
	if c.backendsOK {
		for i := range c.backends {
			c.checkBackend(&c.backends[i], snap, fs)
		}
		if c.podsOK {
			c.checkOrphans(fs)
		}
	}
	if c.tenantsOK {
		for i := range c.tenants {
			checkTenant(&c.tenants[i], snap, fs)
		}
	}
	if c.policiesOK {
		c.checkPolicies(fs)
	}
	if c.indexOK {
		c.checkIndex(snap, fs)
	}
}

// checkIndex reports whether the controller ever projected a /snapshot into
// the CacheIndex (IC270): its absence means the controller's snapshot poll
// never succeeded (not running, or cannot reach or authenticate to :8081).
// With the live snapshot it also compares the projection with it (IC271).
func (c *clusterState) checkIndex(snap *controlapi.CacheSnapshot, fs *findings) {
	obj := "cacheindex " + v1alpha1.CacheIndexName
	ci := c.index
	if ci == nil || ci.Status.LastUpdated == nil {
		fs.add(CodeCacheIndex, Warn, obj, "the controller has not projected a server snapshot yet")
		return
	}
	fs.add(CodeCacheIndex, OK, obj, "%d prefixes from %s, last changed %s",
		ci.Status.Prefixes.Summary.Total, cmp.Or(ci.Status.ObservedServer, "the server"), ci.Status.LastUpdated.UTC().Format(time.RFC3339))
	if snap != nil {
		checkIndexDrift(ci, snap, cmp.Or(c.o.DriftGrace, DefaultDriftGrace), time.Now(), fs)
	}
}

// checkIndexDrift compares what the CacheIndex says the server holds with
// what the server's live /snapshot says: the replicas that report stats and
// the tenants that hold entries (which change with pods and tenants, not
// with every KV event, so a working poller keeps them in step). The
// projection changes whenever they (or any replica's stats) do, so one that
// disagrees and has not changed for longer than grace is not being
// refreshed.
func checkIndexDrift(ci *v1alpha1.CacheIndex, snap *controlapi.CacheSnapshot, grace time.Duration, now time.Time, fs *findings) {
	obj := "cacheindex " + v1alpha1.CacheIndexName
	liveReplicas, liveTenants := map[string]bool{}, map[string]bool{}
	for i := range snap.Replicas {
		r := &snap.Replicas[i]
		// The controller's projection rule: prefix-only replicas are not
		// published in CacheIndex.
		if r.StatsReported || !r.LastUpdate.IsZero() || r.HitRate != 0 {
			liveReplicas[r.ReplicaID] = true
		}
	}
	for i := range snap.Tenants {
		liveTenants[snap.Tenants[i].TenantID] = true
	}
	projReplicas, projTenants := map[string]bool{}, map[string]bool{}
	for i := range ci.Status.Replicas {
		projReplicas[ci.Status.Replicas[i].ID] = true
	}
	for i := range ci.Status.Tenants {
		projTenants[ci.Status.Tenants[i].ID] = true
	}
	var diffs []string
	add := func(what string, names []string) {
		if len(names) > 0 {
			diffs = append(diffs, what+" "+nameList(names, 5))
		}
	}
	add("tenants not projected:", quoted(onlyIn(liveTenants, projTenants)))
	add("replicas not projected:", onlyIn(liveReplicas, projReplicas))
	add("tenants projected but gone:", quoted(onlyIn(projTenants, liveTenants)))
	add("replicas projected but gone:", onlyIn(projReplicas, liveReplicas))
	if len(diffs) == 0 {
		fs.add(CodeCacheIndexDrift, OK, obj, "matches the live /snapshot: %s, %s (prefixes: %d projected, %d live)",
			plural(len(liveReplicas), "stats-reporting replica"), plural(len(liveTenants), "tenant"),
			ci.Status.Prefixes.Summary.Total, snap.TotalPrefixes)
		return
	}
	age := now.Sub(ci.Status.LastUpdated.Time).Round(time.Second)
	differs := strings.Join(diffs, "; ")
	if age > grace {
		fs.add(CodeCacheIndexDrift, Warn, obj, "unchanged for %s while the live /snapshot differs (%s); the controller reads %s",
			age, differs, cmp.Or(ci.Status.ObservedServer, "an unnamed server"))
		return
	}
	fs.add(CodeCacheIndexDrift, Info, obj, "last changed %s ago and the live /snapshot differs (%s): the controller's next poll should catch up",
		max(age, 0), differs)
}

// onlyIn lists the keys of a that b lacks, sorted.
func onlyIn(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func quoted(names []string) []string {
	for i := range names {
		names[i] = fmt.Sprintf("%q", names[i])
	}
	return names
}

func objName(kind string, o metav1.Object) string {
	return kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// badWhenTrue are backend conditions that report a problem when True; the
// other non-Ready, non-Progressing ones report a problem when False.
var badWhenTrue = map[string]bool{
	v1alpha1.BackendConditionDegraded:   true,
	v1alpha1.BackendConditionT2Degraded: true,
}

func (c *clusterState) checkBackend(b *v1alpha1.CacheBackend, snap *controlapi.CacheSnapshot, fs *findings) {
	obj := objName("cachebackend", b)
	conds, stale := splitConditions(b.Status.Conditions, b.Generation, b.Status.ObservedGeneration)
	if len(b.Status.Conditions) > 0 && b.Status.ObservedGeneration < b.Generation {
		// The status as a whole is behind; its stale conditions go with it.
		msg := fmt.Sprintf("status is about generation %d, spec is at %d", b.Status.ObservedGeneration, b.Generation)
		if len(stale) > 0 {
			msg += "; not judged, stale: " + describeStale(stale, b.Status.ObservedGeneration)
		}
		fs.add(CodeBackendStale, Warn, obj, "%s", msg)
	} else {
		reportStale(fs, obj, stale, b.Generation, b.Status.ObservedGeneration)
	}
	switch ready := meta.FindStatusCondition(conds, v1alpha1.BackendConditionReady); {
	case ready == nil && hasType(stale, v1alpha1.BackendConditionReady):
		// Reported as stale above: it says nothing about the current spec.
	case ready == nil:
		fs.add(CodeBackendReady, Warn, obj, "no Ready condition: the controller has not reconciled it")
	case ready.Status == metav1.ConditionTrue:
		fs.add(CodeBackendReady, OK, obj, "Ready (%s)", ready.Reason)
	default:
		fs.add(CodeBackendReady, Fail, obj, "Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
	}
	for _, cond := range conds {
		if cond.Type == v1alpha1.BackendConditionReady || cond.Type == v1alpha1.BackendConditionProgressing {
			continue
		}
		bad := cond.Status == metav1.ConditionFalse
		if badWhenTrue[cond.Type] {
			bad = cond.Status == metav1.ConditionTrue
		}
		if bad {
			fs.add(CodeBackendCondition, Warn, obj, "%s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}

	var sel map[string]string
	if b.Spec.EngineSelector != nil {
		sel = b.Spec.EngineSelector.MatchLabels
	}
	if len(sel) == 0 {
		fs.add(CodeEmptySelector, Warn, obj, "spec.engineSelector.matchLabels is empty: no engine pod is claimed")
		return
	}
	if !c.podsOK {
		return
	}
	// The pod webhook's claim rule (claim.Owner): a pod matched by several
	// backends of its namespace belongs to the first by name; one that no
	// backend of its namespace claims belongs to the first backend of
	// another namespace that sets allowCrossNamespace and that the pod's
	// namespace consents to. Pods outside b's namespace are judged only
	// when the Namespaces were read (a run over all namespaces). matched
	// maps each claimed pod to its injected-by annotation ("" when it
	// carries none).
	matched := map[podRef]string{}
	for _, p := range c.pods {
		if p.Namespace != b.Namespace && !c.namespacesOK {
			continue
		}
		cp := claim.Pod{Namespace: p.Namespace, NamespaceAnnotations: c.nsAnnotations[p.Namespace], Labels: p.Labels, Annotations: p.Annotations}
		if claim.Claims(b, c.backends, cp) {
			matched[podRef{p.Namespace, p.Name}] = strings.TrimSpace(p.Annotations[InjectedByAnnotation])
		}
	}
	if len(matched) == 0 {
		msg := fmt.Sprintf("no pod in %s is claimed through engineSelector %s (none matches, or an earlier backend by name claims them)", b.Namespace, formatLabels(sel))
		switch {
		case !b.Spec.AllowCrossNamespace:
		case c.namespacesOK:
			msg = fmt.Sprintf("no pod in %s, or in a namespace whose %s names %s, is claimed through engineSelector %s (none matches, or an earlier backend claims them)",
				b.Namespace, claim.AllowClaimsFromAnnotation, b.Namespace, formatLabels(sel))
		default:
			msg += "; the pods it claims in other namespaces (allowCrossNamespace) were not checked: run the doctor over all namespaces"
		}
		fs.add(CodeEnginePods, Warn, obj, "%s", msg)
		return
	}
	fs.add(CodeEnginePods, OK, obj, "%s match %s", plural(len(matched), "engine pod"), formatLabels(sel))
	checkInjection(b, obj, matched, fs)
	c.checkParticipation(b, obj, matched, snap, fs)
}

// podRef names a claimed pod.
type podRef struct{ namespace, name string }

// in is the pod's name as a backend of namespace ns reports it: the name for
// a pod of ns, namespace/name for one of another namespace.
func (p podRef) in(ns string) string {
	if p.namespace == ns {
		return p.name
	}
	return p.namespace + "/" + p.name
}

// sortedPods returns the claimed pods as backend namespace ns names them,
// sorted, with their refs in the same order.
func sortedPods(matched map[podRef]string, ns string) ([]string, []podRef) {
	refs := slices.SortedFunc(maps.Keys(matched), func(a, b podRef) int {
		return strings.Compare(a.in(ns), b.in(ns))
	})
	names := make([]string, len(refs))
	for i, r := range refs {
		names[i] = r.in(ns)
	}
	return names, refs
}

// checkInjection reports the claimed pods that do not carry the backend's
// injection: admitted while the pod webhook was down or failing open, refused
// by it (it warns and admits), created before the backend, or injected for
// another backend that claimed them then.
func checkInjection(b *v1alpha1.CacheBackend, obj string, matched map[podRef]string, fs *findings) {
	want := b.Namespace + "/" + b.Name
	var none, other []string
	names, refs := sortedPods(matched, b.Namespace)
	for i, name := range names {
		switch by := matched[refs[i]]; by {
		case want:
		case "":
			none = append(none, name)
		default:
			other = append(other, name+" ("+by+")")
		}
	}
	if len(none) == 0 && len(other) == 0 {
		if len(matched) == 1 {
			fs.add(CodeInjection, OK, obj, "the matched pod carries its injection")
		} else {
			fs.add(CodeInjection, OK, obj, "all %d matched pods carry its injection", len(matched))
		}
		return
	}
	var parts []string
	if len(none) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d matched pods were admitted without injection: %s", len(none), len(matched), nameList(none, 5)))
	}
	if len(other) > 0 {
		parts = append(parts, fmt.Sprintf("%d carry another backend's injection: %s", len(other), nameList(other, 5)))
	}
	fs.add(CodeInjection, Warn, obj, "%s", strings.Join(parts, "; "))
}

// checkParticipation looks for the backend's matched pods in the index: in
// the live snapshot (a replica is the pod named by its replicaId in the
// namespace named by its tenant: the pod's own, also for a pod claimed
// across namespaces) or, without one, in status.indexParticipation.
//
// Every matched pod must be there: one that is not has no KV events reaching
// the server, whatever its siblings do.
func (c *clusterState) checkParticipation(b *v1alpha1.CacheBackend, obj string, matched map[podRef]string, snap *controlapi.CacheSnapshot, fs *findings) {
	if snap != nil {
		indexed := map[podRef]bool{}
		var prefixes int64
		for _, r := range snap.Replicas {
			ref := podRef{r.Tenant, r.ReplicaID}
			if _, ok := matched[ref]; ok {
				indexed[ref] = true
				prefixes += r.PrefixCount
			}
		}
		var missing []string
		names, refs := sortedPods(matched, b.Namespace)
		for i, name := range names {
			if !indexed[refs[i]] {
				missing = append(missing, name)
			}
		}
		switch {
		case len(indexed) == 0:
			fs.add(CodeParticipation, Warn, obj, "none of the matched pods (%d) is in the server's index (/snapshot): %s", len(matched), nameList(missing, 5))
		case len(missing) > 0:
			fs.add(CodeParticipation, Warn, obj, "%d of %d matched pods in the index (/snapshot); not in it: %s", len(indexed), len(matched), nameList(missing, 5))
		case prefixes == 0:
			fs.add(CodeParticipation, Info, obj, "%d of %d matched pods report stats but hold no prefixes", len(indexed), len(matched))
		default:
			fs.add(CodeParticipation, OK, obj, "%d of %d matched pods in the index, %d prefixes (/snapshot)", len(indexed), len(matched), prefixes)
		}
		return
	}
	switch p := b.Status.IndexParticipation; {
	case p == nil:
		fs.add(CodeParticipation, Info, obj, "status.indexParticipation not reported yet")
	case p.PrefixCount == 0:
		fs.add(CodeParticipation, Warn, obj, "status.indexParticipation.prefixCount is 0: no KV events indexed")
	default:
		fs.add(CodeParticipation, OK, obj, "%d prefixes (status.indexParticipation)", p.PrefixCount)
	}
}

func formatLabels(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// checkOrphans reports pods injected by a CacheBackend that is gone.
func (c *clusterState) checkOrphans(fs *findings) {
	exists := make(map[string]bool, len(c.backends))
	for i := range c.backends {
		exists[c.backends[i].Namespace+"/"+c.backends[i].Name] = true
	}
	for k, v := range c.remoteBackends {
		exists[k] = v
	}
	for i := range c.pods {
		p := &c.pods[i]
		key, ok := p.Annotations[InjectedByAnnotation]
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		if ns, name, ok := strings.Cut(key, "/"); !ok || ns == "" || name == "" {
			fs.add(CodeOrphanPod, Warn, objName("pod", p), "malformed %s annotation %q (want <namespace>/<name>)", InjectedByAnnotation, key)
			continue
		}
		known, checked := exists[key]
		if !checked {
			ns, _, _ := strings.Cut(key, "/")
			if c.o.Namespace != "" && ns != c.o.Namespace {
				continue // the Get failed and was reported
			}
		}
		if !known {
			fs.add(CodeOrphanPod, Warn, objName("pod", p), "injected by cachebackend %s, which no longer exists", key)
		}
	}
}

func checkTenant(t *v1alpha1.CacheTenant, snap *controlapi.CacheSnapshot, fs *findings) {
	obj := objName("cachetenant", t)
	conds, stale := splitConditions(t.Status.Conditions, t.Generation, t.Status.ObservedGeneration)
	reportStale(fs, obj, stale, t.Generation, t.Status.ObservedGeneration)
	if r := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); r != nil && r.Status == metav1.ConditionFalse {
		fs.add(CodeTenantNotReady, Warn, obj, "Ready=False %s: %s", r.Reason, r.Message)
	}
	var entries *int64
	source := "status.indexEntries"
	if snap != nil {
		source = "/snapshot"
		var n int64 // a tenant absent from the snapshot holds nothing
		for _, ts := range snap.Tenants {
			if ts.TenantID == t.Spec.TenantID {
				n = ts.IndexEntries
			}
		}
		entries = &n
	} else if t.Status.IndexEntries != nil {
		entries = t.Status.IndexEntries
	}
	exceeded := meta.IsStatusConditionTrue(conds, v1alpha1.ConditionQuotaExceeded)
	var limit *int64
	if t.Spec.Quota != nil {
		limit = t.Spec.Quota.MaxIndexEntries
	}
	switch {
	case limit == nil && entries == nil:
		fs.add(CodeTenantQuota, OK, obj, "tenant %q: no quota", t.Spec.TenantID)
	case limit == nil:
		fs.add(CodeTenantQuota, OK, obj, "tenant %q: no quota, %d entries (%s)", t.Spec.TenantID, *entries, source)
	case exceeded:
		fs.add(CodeTenantQuota, Fail, obj, "tenant %q: QuotaExceeded=True, %s", t.Spec.TenantID, usage(entries, *limit, source))
	case entries == nil:
		fs.add(CodeTenantQuota, Info, obj, "tenant %q: quota %d, entries not observed yet", t.Spec.TenantID, *limit)
	case *entries > *limit:
		fs.add(CodeTenantQuota, Fail, obj, "tenant %q: %d entries over the quota of %d (%s)", t.Spec.TenantID, *entries, *limit, source)
	case *limit == 0:
		fs.add(CodeTenantQuota, Info, obj, "tenant %q: quota 0 admits no entries", t.Spec.TenantID)
	case float64(*entries) >= quotaWarnFraction*float64(*limit):
		fs.add(CodeTenantQuota, Warn, obj, "tenant %q: %d of %d entries (%.0f%%, %s)", t.Spec.TenantID, *entries, *limit, 100*float64(*entries)/float64(*limit), source)
	default:
		fs.add(CodeTenantQuota, OK, obj, "tenant %q: %d of %d entries (%s)", t.Spec.TenantID, *entries, *limit, source)
	}
}

func usage(n *int64, limit int64, source string) string {
	if n == nil {
		return fmt.Sprintf("quota %d, entries not observed", limit)
	}
	return fmt.Sprintf("%d of %d entries (%s)", *n, limit, source)
}

// plural is "1 pod" or "n pods".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func (c *clusterState) checkPolicies(fs *findings) {
	governed := map[string]bool{}
	for i := range c.policies {
		p := &c.policies[i]
		governed[p.Namespace] = true
		obj := objName("cachepolicy", p)
		conds, stale := splitConditions(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration)
		reportStale(fs, obj, stale, p.Generation, p.Status.ObservedGeneration)
		acc := meta.FindStatusCondition(conds, v1alpha1.ConditionAccepted)
		switch {
		case acc == nil && hasType(stale, v1alpha1.ConditionAccepted):
			continue // reported as stale: no verdict on the current spec
		case acc == nil:
			fs.add(CodePolicyAccepted, Warn, obj, "no Accepted condition: the controller has not reconciled it")
			continue
		case acc.Status != metav1.ConditionTrue:
			fs.add(CodePolicyAccepted, Fail, obj, "Accepted=%s %s: %s", acc.Status, acc.Reason, acc.Message)
			continue
		}
		fs.add(CodePolicyAccepted, OK, obj, "Accepted")
		if pr := meta.FindStatusCondition(conds, v1alpha1.ConditionPropagated); pr != nil {
			if pr.Status == metav1.ConditionTrue {
				fs.add(CodePolicyPropagated, OK, obj, "Propagated (%s)", pr.Reason)
			} else {
				fs.add(CodePolicyPropagated, Warn, obj, "Propagated=%s %s: %s", pr.Status, pr.Reason, pr.Message)
			}
		}
	}
	type usage struct{ backends, tenants int }
	used := map[string]*usage{}
	at := func(ns string) *usage {
		if used[ns] == nil {
			used[ns] = &usage{}
		}
		return used[ns]
	}
	if c.backendsOK {
		for i := range c.backends {
			at(c.backends[i].Namespace).backends++
		}
	}
	if c.tenantsOK {
		for i := range c.tenants {
			at(c.tenants[i].Namespace).tenants++
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(used)) {
		u := used[ns]
		if governed[ns] {
			fs.add(CodePolicyCoverage, OK, "namespace "+ns, "covered by a CachePolicy")
			continue
		}
		fs.add(CodePolicyCoverage, Warn, "namespace "+ns, "%s and %s but no CachePolicy: server defaults apply", plural(u.backends, "CacheBackend"), plural(u.tenants, "CacheTenant"))
	}
}
