{{/*
Object names are fixed, as in operator/config: the controller's flags, the
webhook configurations, the alert rules (job="inferencecache-server-metrics")
and `inferencecache doctor` look for these names, and most of the objects are
cluster-scoped, so one release per cluster. The namespace is the release's.
*/}}

{{/* The labels Helm's own bookkeeping adds to every object's metadata (not to
pod templates or selectors, so an upgrade does not restart pods for them). */}}
{{- define "inferencecache.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* metadata.labels of a component's objects: its name, part-of, Helm's. */}}
{{- define "inferencecache.componentLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: inferencecache
{{ include "inferencecache.helmLabels" .root }}
{{- end -}}

{{/* metadata.labels of the objects that belong to no one component. */}}
{{- define "inferencecache.labels" -}}
app.kubernetes.io/part-of: inferencecache
{{ include "inferencecache.helmLabels" . }}
{{- end -}}

{{/* An image reference: (dict "root" $ "image" .Values.x.image "name" "server"). */}}
{{- define "inferencecache.image" -}}
{{- $repo := .image.repository | default (printf "%s/%s" .root.Values.image.registry .name) -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* The server's internal (:8081) Service address the controller pushes to. */}}
{{- define "inferencecache.serverHost" -}}
inferencecache-server.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* One `---`-separated YAML file of files/ as a list of objects (empty documents dropped). */}}
{{- define "inferencecache.docs" -}}
{{- $docs := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .path) -1 -}}
{{- if trim $doc -}}
{{- $docs = append $docs (fromYaml $doc) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "items" $docs) -}}
{{- end -}}

{{/* Common pod fields from a component's values. */}}
{{- define "inferencecache.podScheduling" -}}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}
