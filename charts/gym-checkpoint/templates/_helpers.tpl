{{/* Chart name, overridable with nameOverride. */}}
{{- define "gym-checkpoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Release-qualified name, at most 28 characters so "<fullname>-<server>-0" fits a DNS label. A release name that does
not fit whole gets its first 19 characters and 8 of the sha256 of the full name: two long release names sharing a
prefix never render one name for their objects (the Kubernetes Lease, <fullname>-generated, ...). A release name of
28 characters or fewer keeps what it always rendered (only "-gym-checkpoint" is cut short): upgrades rename nothing.
*/}}
{{- define "gym-checkpoint.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 28 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $full := ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- if le (len .Release.Name) 28 -}}
{{- $full | trunc 28 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" ($full | trunc 19 | trimSuffix "-") ($full | sha256sum | trunc 8) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Standard labels on every object. */}}
{{- define "gym-checkpoint.labels" -}}
helm.sh/chart: {{ include "gym-checkpoint.chart" . }}
{{ include "gym-checkpoint.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gym-checkpoint
{{- end -}}

{{/* The labels the release's selectors use; the operator finds its stack by these too. */}}
{{- define "gym-checkpoint.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gym-checkpoint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Every server the chart runs: .Values.servers, then the rollout collection server when rollouts.enabled.
Returned as YAML ({servers: [...]}) for fromYaml; each entry gains "collection: true" for the latter.
*/}}
{{- define "gym-checkpoint.allServers" -}}
{{- $servers := list -}}
{{- range .Values.servers }}{{- $servers = append $servers . -}}{{- end -}}
{{- if .Values.rollouts.enabled -}}
{{- $r := .Values.rollouts -}}
{{- $agents := dict -}}
{{- if $r.agents -}}
{{- range $agent, $server := $r.agents -}}
{{- $_ := set $agents $agent (include "gym-checkpoint.serverUrl" (dict "root" $ "name" $server)) -}}
{{- end -}}
{{- else -}}
{{- range $.Values.servers -}}
{{- if eq (toString .role) "agent" -}}
{{- $_ := set $agents .name (include "gym-checkpoint.serverUrl" (dict "root" $ "name" .name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $config := merge (dict "agents" $agents "data_dir" "/data") (deepCopy ($r.config | default dict)) -}}
{{- $default := $r.defaultAgent -}}
{{- if and (not $default) (eq (len $agents) 1) -}}{{- $default = first (keys $agents) -}}{{- end -}}
{{- if $default -}}{{- $_ := set $config "default_agent" $default -}}{{- end -}}
{{- $collection := dict "name" $r.name "server" "collection" "role" "controller" "port" $r.port "config" $config "persistence" $r.persistence "collection" true -}}
{{- if $r.resources -}}{{- $_ := set $collection "resources" $r.resources -}}{{- end -}}
{{- $servers = append $servers $collection -}}
{{- end -}}
{{- toYaml (dict "servers" $servers) -}}
{{- end -}}

{{/* Name of one server's workload, Service and ConfigMap: dict "root" $ "server" $server. */}}
{{- define "gym-checkpoint.serverName" -}}
{{- printf "%s-%s" (include "gym-checkpoint.fullname" .root) .server.name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/*
In-cluster base URL of a server by its name, for server configs: include "gym-checkpoint.serverUrl" (dict "root" $ "name" "policy-model").
A server with replicas > 1 is every pod of its StatefulSet under the headless Service, written as one URL with an
ordinal range ("http://<name>-{0..N-1}.<name>-headless.<namespace>.svc:<port>"), which the servers expand: callers
send each rollout to the pod its id hashes to (docs/decisions.md, "Rollout affinity is a hash of the rollout id").
*/}}
{{- define "gym-checkpoint.serverUrl" -}}
{{- $port := 8000 -}}
{{- $replicas := 1 -}}
{{- range .root.Values.servers -}}{{- if eq .name $.name -}}{{- $port = .port | default 8000 -}}{{- $replicas = int (.replicas | default 1) -}}{{- end -}}{{- end -}}
{{- if and .root.Values.rollouts.enabled (eq .name .root.Values.rollouts.name) -}}{{- $port = .root.Values.rollouts.port -}}{{- $replicas = 1 -}}{{- end -}}
{{- $full := include "gym-checkpoint.serverName" (dict "root" .root "server" (dict "name" .name)) -}}
{{- if gt $replicas 1 -}}
{{- printf "http://%s-{0..%d}.%s-headless.%s.svc:%v" $full (sub $replicas 1) $full .root.Release.Namespace $port -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%v" $full .root.Release.Namespace $port -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest: dict "image" .Values.image "default" appVersion */}}
{{- define "gym-checkpoint.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .default .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.image" -}}
{{- include "gym-checkpoint.imageRef" (dict "image" .Values.image "default" .Chart.AppVersion) -}}
{{- end -}}

{{- define "gym-checkpoint.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "gym-checkpoint.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.serverServiceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-server" (include "gym-checkpoint.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Where each secret value comes from, in this order: an existing Secret you manage (existingSecret), a Secret the
chart renders from the value you give (value, storage.s3.accessKeyId), else the release's generated Secret, which
the secrets hook creates once with random values and never changes (templates/secrets-hook.yaml). Nothing here
reads the cluster (no lookup), so `helm template` renders the same every time (Argo CD, Flux).
*/}}
{{- define "gym-checkpoint.generatedSecretName" -}}
{{- printf "%s-generated" (include "gym-checkpoint.fullname" .) -}}
{{- end -}}

{{- define "gym-checkpoint.controlSecretName" -}}
{{- if .Values.controlToken.existingSecret -}}{{- .Values.controlToken.existingSecret -}}
{{- else if .Values.controlToken.value -}}{{- printf "%s-control" (include "gym-checkpoint.fullname" .) -}}
{{- else -}}{{- include "gym-checkpoint.generatedSecretName" . -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.controlSecretKey" -}}
{{- if .Values.controlToken.existingSecret -}}{{- .Values.controlToken.existingSecretKey | default "token" -}}{{- else -}}token{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.sessionSecretName" -}}
{{- if .Values.sessionSecret.existingSecret -}}{{- .Values.sessionSecret.existingSecret -}}
{{- else if .Values.sessionSecret.value -}}{{- printf "%s-session" (include "gym-checkpoint.fullname" .) -}}
{{- else -}}{{- include "gym-checkpoint.generatedSecretName" . -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.sessionSecretKey" -}}
{{- if .Values.sessionSecret.existingSecret -}}{{- .Values.sessionSecret.existingSecretKey | default "secret" -}}{{- else -}}secret{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.s3SecretName" -}}
{{- if .Values.storage.s3.existingSecret -}}{{- .Values.storage.s3.existingSecret -}}
{{- else if .Values.storage.s3.accessKeyId -}}{{- printf "%s-s3" (include "gym-checkpoint.fullname" .) -}}
{{- else -}}{{- include "gym-checkpoint.storageSecretName" . -}}
{{- end -}}
{{- end -}}

{{/* The generated Secret only the operator and the embedded store read: the embedded store's keys and the storage
gateway's signing key. The servers never reference it (<fullname>-generated holds their tokens). */}}
{{- define "gym-checkpoint.storageSecretName" -}}
{{- printf "%s-storage" (include "gym-checkpoint.fullname" .) -}}
{{- end -}}

{{/* The generated Secret's keys as KEY=LENGTH words; empty when every value is given or existing. */}}
{{- define "gym-checkpoint.generatedKeys" -}}
{{- $keys := list -}}
{{- if not (or .Values.controlToken.existingSecret .Values.controlToken.value) -}}{{- $keys = append $keys "token=48" -}}{{- end -}}
{{- if not (or .Values.sessionSecret.existingSecret .Values.sessionSecret.value) -}}{{- $keys = append $keys "secret=48" -}}{{- end -}}
{{- join " " $keys -}}
{{- end -}}

{{/* The generated storage Secret's keys (the embedded store's, the gateway's signing key) as KEY=LENGTH words. */}}
{{- define "gym-checkpoint.generatedStorageKeys" -}}
{{- $keys := list -}}
{{- if and .Values.operator.enabled (not .Values.storage.gateway.existingSecret) -}}{{- $keys = append $keys "gateway-key=48" -}}{{- end -}}
{{- if and .Values.storage.embedded.enabled (not (or .Values.storage.s3.existingSecret .Values.storage.s3.accessKeyId)) -}}
{{- $keys = concat $keys (list "AWS_ACCESS_KEY_ID=20" "AWS_SECRET_ACCESS_KEY=40") -}}
{{- end -}}
{{- join " " $keys -}}
{{- end -}}

{{/* "true" when workloads get AWS credentials from a Secret (chart-made or existing). */}}
{{- define "gym-checkpoint.s3Credentials" -}}
{{- if or .Values.storage.s3.existingSecret .Values.storage.s3.accessKeyId .Values.storage.embedded.enabled -}}true{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.embeddedName" -}}
{{- printf "%s-s3" (include "gym-checkpoint.fullname" .) -}}
{{- end -}}

{{/* S3 endpoint: the explicit one, else the embedded store's Service. */}}
{{- define "gym-checkpoint.s3Endpoint" -}}
{{- if .Values.storage.s3.endpoint -}}
{{- .Values.storage.s3.endpoint -}}
{{- else if .Values.storage.embedded.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "gym-checkpoint.embeddedName" .) .Release.Namespace .Values.storage.embedded.port -}}
{{- end -}}
{{- end -}}

{{/* Default checkpoint location of the stack: the explicit one, else a prefix in the embedded store's bucket. */}}
{{- define "gym-checkpoint.storageLocation" -}}
{{- if .Values.storage.location -}}
{{- .Values.storage.location -}}
{{- else if .Values.storage.embedded.enabled -}}
{{- printf "s3://%s/%s" .Values.storage.embedded.bucket .Release.Name -}}
{{- end -}}
{{- end -}}

{{/*
sha256 of the Secret values the chart renders from the values (tokens, S3 keys given as values), as a pod
annotation: changing one rolls the pods on the next upgrade. Generated values never change; an existingSecret is
not read (no lookup: the render must not depend on the cluster), so after changing one, restart the pods
yourself (docs/operations/upgrade.md).
*/}}
{{- define "gym-checkpoint.secretsChecksum" -}}
{{- $parts := list -}}
{{- if and .Values.controlToken.value (not .Values.controlToken.existingSecret) -}}{{- $parts = append $parts (.Values.controlToken.value | b64enc) -}}{{- end -}}
{{- if and .Values.sessionSecret.value (not .Values.sessionSecret.existingSecret) -}}{{- $parts = append $parts (.Values.sessionSecret.value | b64enc) -}}{{- end -}}
{{- if and .Values.storage.s3.accessKeyId (not .Values.storage.s3.existingSecret) -}}
{{- $parts = concat $parts (list (.Values.storage.s3.accessKeyId | b64enc) (.Values.storage.s3.secretAccessKey | b64enc)) -}}
{{- end -}}
{{- join "\n" $parts | sha256sum -}}
{{- end -}}

{{/* The control token, for the servers and the operator. No storage key reaches a server: the operator alone reads
the storage locations' Secrets, and signs each object a server writes or reads (docs/decisions.md, "Participants
reach storage through presigned requests"). */}}
{{- define "gym-checkpoint.tokenEnv" -}}
- name: GYMCKPT_CONTROL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "gym-checkpoint.controlSecretName" . }}
      key: {{ include "gym-checkpoint.controlSecretKey" . }}
{{- end -}}

{{/* Where the servers ask for their storage requests to be signed: the operator's storage gateway. */}}
{{- define "gym-checkpoint.gatewayUrl" -}}
{{- printf "http://%s-operator.%s.svc:%v" (include "gym-checkpoint.fullname" .) .Release.Namespace .Values.operator.storageGateway.port -}}
{{- end -}}

{{/* The Secret of the storage gateway's signing key (the generated storage Secret, or yours). */}}
{{- define "gym-checkpoint.gatewaySecretName" -}}
{{- .Values.storage.gateway.existingSecret | default (include "gym-checkpoint.storageSecretName" .) -}}
{{- end -}}

{{/* runAsUser/runAsGroup only when set (null: the platform assigns them, as OpenShift's restricted SCC does). */}}
{{- define "gym-checkpoint.ids" -}}
{{- with .Values.security.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.security.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
{{- end -}}

{{/* Restricted-profile container security context. */}}
{{- define "gym-checkpoint.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
{{- include "gym-checkpoint.ids" . }}
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gym-checkpoint.podSecurityContext" -}}
runAsNonRoot: true
{{- include "gym-checkpoint.ids" . }}
{{- with .Values.security.fsGroup }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Pod scheduling fields: dict "nodeSelector" .. "tolerations" .. "affinity" .. "priorityClassName" .. "topologySpreadConstraints" .. */}}
{{- define "gym-checkpoint.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Capacity of the embedded store: how many SeaweedFS volumes of volumeSizeLimitMB fit in 90% of
persistence.size (the rest is headroom for indexes and the filer's metadata).
*/}}
{{- define "gym-checkpoint.embeddedVolumes" -}}
{{- $e := .Values.storage.embedded -}}
{{- $size := $e.persistence.size -}}
{{- $number := regexFind "^[0-9]+" $size | atoi -}}
{{- $unit := trimPrefix (toString $number) $size -}}
{{- $mib := $number -}}
{{- if eq $unit "Gi" }}{{ $mib = mul $number 1024 }}{{ else if eq $unit "Ti" }}{{ $mib = mul $number 1048576 }}{{ end -}}
{{- div (mul $mib 9) (mul $e.volumeSizeLimitMB 10) -}}
{{- end -}}

