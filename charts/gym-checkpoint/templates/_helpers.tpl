{{/* Chart name, overridable with nameOverride. */}}
{{- define "gym-checkpoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; kept short so "<fullname>-<server>-0" fits a DNS label. */}}
{{- define "gym-checkpoint.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 28 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 28 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 28 | trimSuffix "-" -}}
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

{{/* Name of one server's workload, Service and ConfigMap: dict "root" $ "server" $server. */}}
{{- define "gym-checkpoint.serverName" -}}
{{- printf "%s-%s" (include "gym-checkpoint.fullname" .root) .server.name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* In-cluster base URL of a server by its values name, for server configs: include "gym-checkpoint.serverUrl" (dict "root" $ "name" "policy-model") */}}
{{- define "gym-checkpoint.serverUrl" -}}
{{- $port := 8000 -}}
{{- range .root.Values.servers -}}{{- if eq .name $.name -}}{{- $port = .port | default 8000 -}}{{- end -}}{{- end -}}
{{- printf "http://%s-%s.%s.svc:%v" (include "gym-checkpoint.fullname" .root) .name .root.Release.Namespace $port -}}
{{- end -}}

{{- define "gym-checkpoint.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gym-checkpoint.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "gym-checkpoint.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gym-checkpoint.controlSecretName" -}}
{{- default (printf "%s-control" (include "gym-checkpoint.fullname" .)) .Values.controlToken.existingSecret -}}
{{- end -}}

{{- define "gym-checkpoint.sessionSecretName" -}}
{{- default (printf "%s-session" (include "gym-checkpoint.fullname" .)) .Values.sessionSecret.existingSecret -}}
{{- end -}}

{{- define "gym-checkpoint.s3SecretName" -}}
{{- default (printf "%s-s3" (include "gym-checkpoint.fullname" .)) .Values.storage.s3.existingSecret -}}
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
A Secret value, base64-encoded: the explicit value, else the value already in the cluster (so upgrades
keep generated tokens), else a fresh random one. dict "root" $ "secret" name "key" key "value" explicit "length" n
*/}}
{{- define "gym-checkpoint.secretValue" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if .value -}}
{{- .value | b64enc -}}
{{- else if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum (.length | default 48) | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by the servers and the operator: tokens and S3 access. */}}
{{- define "gym-checkpoint.commonEnv" -}}
- name: GYMCKPT_CONTROL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "gym-checkpoint.controlSecretName" . }}
      key: {{ .Values.controlToken.existingSecretKey | default "token" }}
{{- if include "gym-checkpoint.s3Credentials" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "gym-checkpoint.s3SecretName" . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "gym-checkpoint.s3SecretName" . }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- with include "gym-checkpoint.s3Endpoint" . }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.storage.s3.region }}
- name: AWS_REGION
  value: {{ . | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Restricted-profile container security context. */}}
{{- define "gym-checkpoint.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gym-checkpoint.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
fsGroup: {{ .Values.security.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}
