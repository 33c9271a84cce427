// Package endpoints says which endpoints an endpoint picker may choose from:
// an immutable Pool (the serving addresses, the replica id each one's KV
// events are reported under, and the index scope requests resolve to),
// published by a Source. Pool is lock-free: a source builds a new Pool on
// every relevant change and swaps it in atomically.
//
// Sources:
//   - Fixed: one pool, for tests and embedding.
//   - File (--endpoints-file): a static YAML or JSON file, for Envoy
//     outside Kubernetes, reloaded on change.
//   - InferencePool (--inference-pool NAMESPACE/NAME): a Gateway API
//     Inference Extension InferencePool (inference.networking.k8s.io/v1)
//     and its Ready pods.
//
// # The endpoints file
//
// YAML or JSON, decoded strictly: an unknown or duplicate field, or a key
// in the wrong case, is an error naming the file and the field.
//
//	tenant: team-a                 # required: the index tenant
//	hashScheme: vllm               # optional, default "vllm"
//	endpoints:                     # may be empty
//	- replicaId: pod-a             # the --replica-id of its kvevent subscriber
//	  address: 10.0.0.7:8000       # ip:port, or [v6]:port
//	models:                        # optional: request model name -> index scope
//	- name: my-lora                # the "model" of the request
//	  modelId: meta-llama/Llama-3.1-8B-Instruct  # the index model id (served base model)
//	  adapterId: my-lora           # optional: the LoRA adapter; empty for an alias
//
// A model name the list lacks resolves to itself with no adapter. NewFile
// fails if the file is not valid, so a server refuses to start on a bad
// file. Afterwards the file's directory is watched (fsnotify), so writes
// in place, an atomic rename over the file and a Kubernetes ConfigMap
// volume's ..data symlink swap are all seen; the file is also re-read
// every 10 s (WithResyncInterval). A content hash makes an unchanged file
// publish nothing. A bad edit keeps the last good pool; it is logged
// (rate-limited) and reported once to the Observer.
//
// # The InferencePool source
//
// It watches one InferencePool and its pods through controller-runtime
// caches limited to the pool's namespace: one for the InferencePool (a
// metadata.name field selector), one for the pods restricted to the pool's
// spec.selector.matchLabels (a label selector on the pod list and watch).
// When the selector changes, the pod cache is replaced by one for the new
// selector and the old pool stays published until the new cache has
// synced: memory stays proportional to the pool, not to every pod of the
// namespace, and selector changes are rare. The pod cache keeps only the
// fields the pool needs (name, labels, deletion timestamp, pod IP, the
// Ready condition); managed fields are stripped from the InferencePool.
// An empty selector selects no pod (as for a Service).
//
// A pod contributes endpoints while it is Ready: its PodReady condition is
// True, it has no deletion timestamp and it has a status.podIP. It has one
// endpoint per spec.targetPorts[r].number, at podIP:number.
//
// The replica-id rule (it must match the --replica-id the pod's kvevent
// subscribers report, which the pod injection sets to $(POD_NAME)):
//   - a pool with one target port: the replica id is the pod name;
//   - a pool with R > 1 target ports (data-parallel ranks, one port per
//     rank, in rank order): the endpoint of targetPorts[r] has replica id
//     "<pod name>-dp<r>", r = 0..R-1, and the rank-r subscriber must
//     report $(POD_NAME)-dp<r>.
//
// ReplicaID implements the rule. Two Ready pods claiming one address
// (hostNetwork pods on one node) keep it for the first by name; the other
// is logged.
//
// The tenant is the pool's namespace. Annotations of the InferencePool:
//   - inferencecache.io/hash-scheme: the hash scheme (default "vllm";
//     "sglang" for SGLang engines), as the subscribers' --hash-scheme.
//   - inferencecache.io/models: the model map, a JSON list of the models
//     entries of the endpoints file, e.g.
//     [{"name":"my-lora","modelId":"meta-llama/Llama-3.1-8B-Instruct","adapterId":"my-lora"}].
//     An invalid value is reported once and the last valid map stays.
//
// A deleted (or not yet created) InferencePool is an empty pool: the
// source is synced, with no endpoints. Run first lists the InferencePool
// and the namespace's pods once and returns an error if RBAC refuses it or
// the InferencePool CRD is not installed; other failures are retried.
//
// RBAC: a Role in the pool's namespace, bound to the picker's
// ServiceAccount; nothing cluster-wide:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: Role
//	metadata:
//	  name: inferencecache-endpoint-picker
//	  namespace: <pool namespace>
//	rules:
//	- apiGroups: [""]
//	  resources: ["pods"]
//	  verbs: ["list", "watch"]
//	- apiGroups: ["inference.networking.k8s.io"]
//	  resources: ["inferencepools"]
//	  verbs: ["list", "watch"]
//
// (get is not needed: everything is read through list and watch.)
//
// # Observing
//
// An Observer (WithObserver) is told each published pool's size and each
// failed reload, with a reason from a small fixed set (ReasonRead,
// ReasonDecode, ReasonInvalid, ReasonWatch), for metrics. Synced is closed
// once a source knows its first pool, for readiness.
package endpoints
