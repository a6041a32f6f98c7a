{{/* Names, labels and the pieces every plane's pod shares. */}}

{{- define "llmmesh.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "llmmesh.labels" -}}
app.kubernetes.io/name: llmmesh
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "llmmesh.selector" -}}
app.kubernetes.io/name: llmmesh
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: repository@digest when a digest is set, else :tag. */}}
{{- define "llmmesh.image" -}}
{{- if .digest -}}
{{ .repository }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
{{- end -}}

{{- define "llmmesh.secretName" -}}
{{- if .Values.secrets.create -}}
{{ include "llmmesh.fullname" . }}-secrets
{{- else -}}
{{ required "secrets.existingSecret names the Secret with the connection strings" .Values.secrets.existingSecret }}
{{- end -}}
{{- end -}}

{{- define "llmmesh.globalAddress" -}}
{{- if .Values.globalPlane.address -}}
{{ .Values.globalPlane.address }}
{{- else -}}
{{ .Values.globalPlane.serviceName }}.{{ .Release.Namespace }}.svc.cluster.local:{{ .Values.globalPlane.port }}
{{- end -}}
{{- end -}}

{{/* LLMMESH_* variables for mTLS (or plaintext) and the plaintext probe port. */}}
{{- define "llmmesh.tlsEnv" -}}
{{- if .root.Values.mtls.enabled }}
- name: LLMMESH_TLS_CERT
  value: /etc/llmmesh/tls/tls.crt
- name: LLMMESH_TLS_KEY
  value: /etc/llmmesh/tls/tls.key
- name: LLMMESH_TLS_CA
  value: /etc/llmmesh/tls/ca.crt
{{- if .probe }}
- name: LLMMESH_PROBE_PORT
  value: {{ .root.Values.probes.port | quote }}
{{- end }}
{{- else }}
- name: LLMMESH_INSECURE
  value: "true"
{{- end }}
{{- end -}}

{{/* LLMMESH_* variables for traces and logs (values' observability block),
and for a zone-bound plane (given "placement": true) the zone and region
on its spans' resource (OTEL_RESOURCE_ATTRIBUTES, as `llmmesh up` sets
them). A component's `env` naming one of them would be a second,
conflicting value: the render fails instead. */}}
{{- define "llmmesh.observabilityEnv" -}}
{{- $o := .root.Values.observability }}
{{- range $name := list "LLMMESH_OTLP_ENDPOINT" "LLMMESH_TRACE_SAMPLE_RATIO" "LLMMESH_LOG_FORMAT" "OTEL_RESOURCE_ATTRIBUTES" }}
{{- if hasKey $.env $name }}
{{- fail (printf "%s is set by the observability values; remove it from the component's env" $name) }}
{{- end }}
{{- end }}
- name: LLMMESH_OTLP_ENDPOINT
  value: {{ $o.otlpEndpoint | quote }}
- name: LLMMESH_TRACE_SAMPLE_RATIO
  value: {{ $o.traceSampleRatio | toString | quote }}
- name: LLMMESH_LOG_FORMAT
  value: {{ $o.logFormat | quote }}
{{- if .placement }}
{{- $r := .root.Values.region }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "llmmesh.zone=%s,llmmesh.region=%s" $r.zone $r.name | quote }}
{{- end }}
{{- end -}}

{{/* The corporate CA bundle (values' trustBundle): the variables that point
every outbound TLS client at it. Python's ssl (Redis rediss://), requests,
libpq (PostgreSQL and CockroachDB: a URL's own sslrootcert wins) and the
OTLP exporter each read a different one. */}}
{{- define "llmmesh.trustEnv" -}}
{{- $t := .Values.trustBundle }}
{{- if or $t.secretName $t.configMapName }}
{{- $file := printf "/etc/llmmesh/trust/%s" $t.key }}
{{- range $name := list "SSL_CERT_FILE" "REQUESTS_CA_BUNDLE" "PGSSLROOTCERT" "OTEL_EXPORTER_OTLP_CERTIFICATE" }}
- name: {{ $name }}
  value: {{ $file | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "llmmesh.trustVolume" -}}
{{- $t := .Values.trustBundle }}
{{- if and $t.secretName $t.configMapName }}
{{- fail "trustBundle: name a secretName or a configMapName, not both" }}
{{- end }}
{{- if $t.secretName }}
- name: trust
  secret:
    secretName: {{ $t.secretName }}
    items: [{key: {{ $t.key | quote }}, path: {{ $t.key | quote }}}]
    defaultMode: 0444
{{- else if $t.configMapName }}
- name: trust
  configMap:
    name: {{ $t.configMapName }}
    items: [{key: {{ $t.key | quote }}, path: {{ $t.key | quote }}}]
    defaultMode: 0444
{{- end }}
{{- end -}}

{{- define "llmmesh.trustMount" -}}
{{- if or .Values.trustBundle.secretName .Values.trustBundle.configMapName }}
- name: trust
  mountPath: /etc/llmmesh/trust
  readOnly: true
{{- end }}
{{- end -}}

{{/* The port kubelet's gRPC probe asks: the plaintext probe port under mTLS. */}}
{{- define "llmmesh.probePort" -}}
{{- if .root.Values.mtls.enabled -}}
{{ .root.Values.probes.port }}
{{- else -}}
{{ .port }}
{{- end -}}
{{- end -}}

{{/* Extra LLMMESH_* settings from a component's `env` map, in a stable order. */}}
{{- define "llmmesh.extraEnv" -}}
{{- range $name := keys . | sortAlpha }}
- name: {{ $name }}
  value: {{ index $ $name | toString | quote }}
{{- end }}
{{- end -}}

{{- define "llmmesh.podSecurity" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling of one component (.values, with .selector its labels):
node selector, tolerations, affinity, and how its replicas spread: the
component's own topologySpreadConstraints, else (topologySpread.enabled)
across zones and nodes, as evenly as the cluster allows. */}}
{{- define "llmmesh.scheduling" -}}
{{- $v := .values }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $spread := .selector.root.Values.topologySpread }}
{{- if $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml $v.topologySpreadConstraints | nindent 2 }}
{{- else if $spread.enabled }}
topologySpreadConstraints:
{{- range $key := $spread.topologyKeys }}
  - maxSkew: {{ $spread.maxSkew }}
    topologyKey: {{ $key }}
    whenUnsatisfiable: {{ $spread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "llmmesh.selector" $.selector | nindent 8 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Volumes every mesh plane mounts: its home (writable) and its mTLS secret. */}}
{{- define "llmmesh.volumes" -}}
- name: home
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if .root.Values.mtls.enabled }}
- name: tls
  secret:
    secretName: {{ index .root.Values.mtls.secrets .plane }}
    defaultMode: 0440
{{- end }}
{{- include "llmmesh.trustVolume" .root }}
{{- end -}}

{{- define "llmmesh.volumeMounts" -}}
- name: home
  mountPath: /var/lib/llmmesh
- name: tmp
  mountPath: /tmp
{{- if .root.Values.mtls.enabled }}
- name: tls
  mountPath: /etc/llmmesh/tls
  readOnly: true
{{- end }}
{{- include "llmmesh.trustMount" .root }}
{{- end -}}

{{/* Readiness and liveness on grpc.health.v1 (kubelet's native gRPC probe).
Liveness asks the server-wide status (the process); readiness asks
.readinessService when given: a plane whose dependencies are down reports
its services NOT_SERVING but stays alive (llmmesh/core/readiness.py). */}}
{{- define "llmmesh.grpcProbes" -}}
readinessProbe:
  grpc:
    port: {{ include "llmmesh.probePort" . }}
    {{- with .readinessService }}
    service: {{ . }}
    {{- end }}
  periodSeconds: {{ .root.Values.probes.periodSeconds }}
  failureThreshold: {{ .root.Values.probes.failureThreshold }}
livenessProbe:
  grpc:
    port: {{ include "llmmesh.probePort" . }}
  initialDelaySeconds: {{ .initialDelaySeconds | default 10 }}
  periodSeconds: {{ .root.Values.probes.periodSeconds }}
  failureThreshold: {{ .root.Values.probes.failureThreshold }}
{{- end -}}

{{/* The plane drains on SIGTERM (server.stop(grace)); preStop first lets
endpoints and routers stop sending it new work. */}}
{{- define "llmmesh.drain" -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .preStopSeconds }}
{{- end -}}
