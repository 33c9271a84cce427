package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CacheBackendType names the cache implementation behind a CacheBackend. The
// schema leaves it open (no enum); the values below are the known ones.
type CacheBackendType string

const (
	BackendLMCache       CacheBackendType = "LMCache"
	BackendSGLangHiCache CacheBackendType = "SGLangHiCache"
	BackendAIBrix        CacheBackendType = "AIBrix"
	BackendMooncake      CacheBackendType = "Mooncake"
	BackendNIXL          CacheBackendType = "NIXL"
	// BackendExternal is a backend the controller does not provision; its
	// address is spec.endpoint.
	BackendExternal CacheBackendType = "External"
)

// DeploymentKind is the workload kind of a managed backend.
// +kubebuilder:validation:Enum=Deployment;StatefulSet
type DeploymentKind string

const (
	DeploymentKindDeployment  DeploymentKind = "Deployment"
	DeploymentKindStatefulSet DeploymentKind = "StatefulSet"
)

// IntegrationMode selects the cache tiers an engine is wired for.
// +kubebuilder:validation:Enum=Offload;EventsOnly
type IntegrationMode string

const (
	// IntegrationOffload wires routing (tier 1) and the offload tier (tier 2).
	IntegrationOffload IntegrationMode = "Offload"
	// IntegrationEventsOnly wires routing only: KV events are observed, no
	// connector is loaded and no backend server is provisioned.
	IntegrationEventsOnly IntegrationMode = "EventsOnly"
)

// IntegrationRole is how an engine uses the backend.
// +kubebuilder:validation:Enum=ReadOnly;WriteOnly;ReadWrite
type IntegrationRole string

const (
	RoleReadOnly  IntegrationRole = "ReadOnly"
	RoleWriteOnly IntegrationRole = "WriteOnly"
	RoleReadWrite IntegrationRole = "ReadWrite"
)

// HiCacheWritePolicy is when SGLang copies KV pages to host memory.
// +kubebuilder:validation:Enum=write_back;write_through;write_through_selective
type HiCacheWritePolicy string

// HiCacheIOBackend is SGLang's host/device transfer implementation.
// +kubebuilder:validation:Enum=direct;kernel;kernel_ascend
type HiCacheIOBackend string

// HiCacheMemoryLayout is SGLang's host-memory tensor layout.
// +kubebuilder:validation:Enum=layer_first;page_first;page_first_direct;page_first_kv_split;page_head
type HiCacheMemoryLayout string

// CacheBackendSpec is the desired state of a cache backend (the shape of the
// API before the runtime/lmCache/remoteStorage refactor).
type CacheBackendSpec struct {
	// Type is the cache implementation. External means the controller
	// provisions nothing and spec.endpoint is required.
	// +optional
	// +kubebuilder:default=LMCache
	Type CacheBackendType `json:"type,omitempty"`

	// DeploymentKind is the workload kind of a managed backend.
	// +optional
	// +kubebuilder:default=Deployment
	DeploymentKind DeploymentKind `json:"deploymentKind,omitempty"`

	// Replicas is the desired number of backend replicas.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// Autoscaling drives a HorizontalPodAutoscaler for the managed workload;
	// it then owns the replica count.
	// +optional
	Autoscaling *CacheBackendAutoscaling `json:"autoscaling,omitempty"`

	// Integration is how inference engines use the backend.
	// +optional
	Integration *CacheBackendIntegration `json:"integration,omitempty"`

	// EngineSelector selects the engine pods this backend claims, by pod
	// labels. An empty map claims nothing.
	// +optional
	EngineSelector *EngineSelector `json:"engineSelector,omitempty"`

	// HiCache configures SGLang's native host-memory cache.
	// +optional
	HiCache *HiCacheSpec `json:"hiCache,omitempty"`

	// BackendConfig holds backend-specific string settings.
	// +optional
	BackendConfig map[string]string `json:"backendConfig,omitempty"`

	// Template holds narrow pod-level overrides for managed backend pods.
	// +optional
	Template *BackendPodOverride `json:"template,omitempty"`

	// Resources of the backend server container.
	// +optional
	// +kubebuilder:default={requests:{memory:"4Gi"},limits:{memory:"8Gi"}}
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// Endpoint is the address of an External backend: host:port or
	// lm://host:port, port required, IPv6 literals bracketed ([::1]:8200).
	// Required when type is External and refused for every other type.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// AllowCrossNamespace acknowledges an endpoint that resolves to a Service
	// in another namespace, and lets the backend claim engine pods of other
	// namespaces that have no claimant of their own and consent: their
	// Namespace's annotation inferencecache.io/allow-claims-from lists this
	// backend's namespace.
	// +optional
	AllowCrossNamespace bool `json:"allowCrossNamespace,omitempty"`

	// RemoteStorage is the backend's remote tier (T2), a store the
	// operator does not run: the functional probe puts and gets a key there
	// (FunctionalProbeOK False/ProbeT2Failed when it cannot).
	// +optional
	RemoteStorage *CacheBackendRemoteStorage `json:"remoteStorage,omitempty"`
}

// RemoteStorageProvider names a remote tier's protocol.
// +kubebuilder:validation:Enum=Redis
type RemoteStorageProvider string

// RemoteStorageRedis is a Redis-protocol store (Redis, Valkey, ...).
const RemoteStorageRedis RemoteStorageProvider = "Redis"

// CacheBackendRemoteStorage is an existing remote tier of a backend.
type CacheBackendRemoteStorage struct {
	// Provider is the store's protocol.
	// +optional
	// +kubebuilder:default=Redis
	Provider RemoteStorageProvider `json:"provider,omitempty"`
	// Endpoint is host:port, redis://[user:password@]host:port[/db] or
	// rediss://... (TLS). Credentials written here are readable by anyone
	// who can read the CacheBackend.
	// +required
	// +kubebuilder:validation:MinLength=1
	Endpoint string `json:"endpoint"`
}

// CacheBackendAutoscaling bounds the backend HPA.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must not exceed maxReplicas"
type CacheBackendAutoscaling struct {
	// MinReplicas is the HPA floor.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// MaxReplicas is the HPA ceiling.
	// +required
	// +kubebuilder:validation:Minimum=1
	MaxReplicas int32 `json:"maxReplicas"`
	// TargetCPUUtilizationPercent is the average CPU utilization the HPA
	// aims for.
	// +optional
	// +kubebuilder:default=80
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	TargetCPUUtilizationPercent *int32 `json:"targetCPUUtilizationPercent,omitempty"`
}

// CacheBackendIntegration is how engines are wired to the backend.
type CacheBackendIntegration struct {
	// Engine is the inference engine, e.g. vllm or sglang.
	// +optional
	// +kubebuilder:default=vllm
	Engine string `json:"engine,omitempty"`
	// Mode selects routing plus offload (Offload) or routing only
	// (EventsOnly).
	// +optional
	// +kubebuilder:default=Offload
	Mode IntegrationMode `json:"mode,omitempty"`
	// Role is whether engines read, write or both.
	// +optional
	// +kubebuilder:default=ReadWrite
	Role IntegrationRole `json:"role,omitempty"`
	// FailOpen keeps serving when the cache is unreachable.
	// +optional
	// +kubebuilder:default=true
	FailOpen *bool `json:"failOpen,omitempty"`
	// FirstEventTimeout bounds how long an available backend may wait for
	// its first KV event before it is reported degraded; a Go duration such
	// as 5m (a unit is required).
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	FirstEventTimeout *metav1.Duration `json:"firstEventTimeout,omitempty"`
	// EngineOverrides amends the non-reserved args and env injected into the
	// engine container.
	// +optional
	EngineOverrides *EngineOverrides `json:"engineOverrides,omitempty"`
	// EngineHostNetwork says the engine pods run on the host network.
	// +optional
	EngineHostNetwork bool `json:"engineHostNetwork,omitempty"`
}

// EngineOverrides amends what is injected into the engine container.
type EngineOverrides struct {
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	SuppressArgs []string `json:"suppressArgs,omitempty"`
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// +optional
	SuppressEnv []string `json:"suppressEnv,omitempty"`
}

// EngineSelector selects engine pods by label equality.
type EngineSelector struct {
	// MatchLabels must all be present on a pod for it to be claimed.
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// HiCacheSpec configures SGLang HiCache. Exactly one of sizeGB and ratio.
// +kubebuilder:validation:XValidation:rule="has(self.sizeGB) != has(self.ratio)",message="set exactly one of sizeGB and ratio"
type HiCacheSpec struct {
	// SizeGB is the host pool size in decimal gigabytes.
	// +optional
	// +kubebuilder:validation:Minimum=1
	SizeGB *int32 `json:"sizeGB,omitempty"`
	// Ratio is the host pool size relative to the device pool, as a decimal
	// string greater than zero without leading zeros, such as 2 or 0.5.
	// +optional
	// +kubebuilder:validation:Pattern=`^(0\.[0-9]*[1-9][0-9]*|[1-9][0-9]*(\.[0-9]+)?)$`
	Ratio string `json:"ratio,omitempty"`
	// +optional
	WritePolicy HiCacheWritePolicy `json:"writePolicy,omitempty"`
	// +optional
	IOBackend HiCacheIOBackend `json:"ioBackend,omitempty"`
	// +optional
	MemoryLayout HiCacheMemoryLayout `json:"memoryLayout,omitempty"`
}

// BackendPodOverride is the narrow set of pod fields a CacheBackend may set on
// its managed pods.
type BackendPodOverride struct {
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// +optional
	RuntimeClassName *string `json:"runtimeClassName,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
}

// IndexParticipation is a backend's slice of the cluster index.
type IndexParticipation struct {
	// PrefixCount is the number of distinct prefixes held by the backend's
	// replicas; always present.
	PrefixCount int64 `json:"prefixCount"`
	// LastEventAt is the newest KV event seen from the backend's replicas.
	// +optional
	LastEventAt *metav1.Time `json:"lastEventAt,omitempty"`
	// HitRate is reserved (never set today).
	// +optional
	HitRate *string `json:"hitRate,omitempty"`
	// T2HitRate is hit tokens over query tokens of the offload tier, in
	// [0,1], present once the tier was queried.
	// +optional
	T2HitRate *string `json:"t2HitRate,omitempty"`
}

// Condition types of CacheBackend.status.conditions.
const (
	BackendConditionReady                = "Ready"
	BackendConditionDegraded             = "Degraded"
	BackendConditionProgressing          = "Progressing"
	BackendConditionFunctionalProbeOK    = "FunctionalProbeOK"
	BackendConditionT2Degraded           = "T2Degraded"
	BackendConditionEngineKernelsHealthy = "EngineKernelsHealthy"
	BackendConditionEngineCompatibility  = "EngineCompatibility"
)

// CacheBackendStatus is the observed state of a cache backend.
type CacheBackendStatus struct {
	// Endpoint is the address clients use.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// MatchedEnginePods counts the pods matching spec.engineSelector at the
	// last reconcile; absent until computed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MatchedEnginePods *int32 `json:"matchedEnginePods,omitempty"`
	// EngineSelectorMessage explains the selector match.
	// +optional
	EngineSelectorMessage string `json:"engineSelectorMessage,omitempty"`
	// FailOpen mirrors the effective spec.integration.failOpen.
	// +optional
	FailOpen *bool `json:"failOpen,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// FirstKVEventObservedAt is written once, when the first KV event was
	// observed.
	// +optional
	FirstKVEventObservedAt *metav1.Time `json:"firstKVEventObservedAt,omitempty"`
	// FirstAvailableAt is written once, when the workload was first
	// available; it anchors the firstEventTimeout clock.
	// +optional
	FirstAvailableAt *metav1.Time `json:"firstAvailableAt,omitempty"`
	// ObservedServerInstance lists the ready cache-server pods as
	// <pod-uid>:<restart-sum>, comma-joined, sorted by pod name.
	// +optional
	ObservedServerInstance string `json:"observedServerInstance,omitempty"`
	// IndexParticipation is the backend's slice of the cluster index.
	// +optional
	IndexParticipation *IndexParticipation `json:"indexParticipation,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=cb,categories=inferencecache
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matchedEnginePods`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// CacheBackend declares a KV-cache backend and how inference engines are
// wired to it.
type CacheBackend struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec   CacheBackendSpec   `json:"spec,omitempty"`
	Status CacheBackendStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CacheBackendList is a list of CacheBackend.
type CacheBackendList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheBackend `json:"items"`
}

func init() {
	register(&CacheBackend{}, &CacheBackendList{})
}
