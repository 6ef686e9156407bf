{{- define "wolfpack.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "wolfpack.labels" -}}
app.kubernetes.io/part-of: wolfpack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- /* Labels a component's pods carry and its Service/PDB/NetworkPolicy select on. */ -}}
{{- define "wolfpack.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/name: {{ .name }}
{{- end -}}

{{- /* The Secret holding the admin credential (key admin-secret) and the generated Redis password. */ -}}
{{- define "wolfpack.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "wolfpack.fullname" .)) -}}
{{- end -}}

{{- define "wolfpack.redisSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-secrets" (include "wolfpack.fullname" .)) -}}
{{- end -}}

{{- define "wolfpack.redisSecretKey" -}}
{{- if .Values.redis.auth.existingSecret -}}{{ .Values.redis.auth.existingSecretKey }}{{- else -}}redis-password{{- end -}}
{{- end -}}

{{- /* Image of a component: {root, name, override}; <repository>-<name>:<tag> unless overridden. */ -}}
{{- define "wolfpack.image" -}}
{{- $img := .override | default dict -}}
{{- $repo := $img.repository | default (printf "%s-%s" .root.Values.image.repository .name) -}}
{{- $tag := $img.tag | default .root.Values.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- /* WOLFPACK_REDIS_URL (plus the password variable it expands), for containers that use the release's
Redis or an external one. */ -}}
{{- define "wolfpack.redisEnv" -}}
{{- $full := include "wolfpack.fullname" . -}}
{{- if .Values.redis.enabled }}
{{- if .Values.redis.auth.enabled }}
- name: WOLFPACK_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "wolfpack.redisSecretName" . }}
      key: {{ include "wolfpack.redisSecretKey" . }}
- name: WOLFPACK_REDIS_URL
  value: "redis://:$(WOLFPACK_REDIS_PASSWORD)@{{ $full }}-redis:6379/0"
{{- else }}
- name: WOLFPACK_REDIS_URL
  value: "redis://{{ $full }}-redis:6379/0"
{{- end }}
{{- else if .Values.redis.urlSecret.name }}
- name: WOLFPACK_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.urlSecret.name }}
      key: {{ .Values.redis.urlSecret.key }}
{{- else if .Values.redis.url }}
- name: WOLFPACK_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- else }}
{{- fail "redis.enabled is false: set redis.url or redis.urlSecret to an external Redis (>= 6.2)" }}
{{- end }}
{{- end -}}

{{- /* Variables every Wolfpack container gets: {root, name, svc, noAdmin}: the run/cache dirs, the admin
credential (not for the gateway, which never uses one of its own: noAdmin), API keys, tracing, the global env
and the component's own env (which wins). */ -}}
{{- define "wolfpack.commonEnv" -}}
{{- $root := .root -}}
{{- $full := include "wolfpack.fullname" $root -}}
- name: WOLFPACK_RUN_DIR
  value: /var/lib/wolfpack
- name: HOME
  value: /var/cache/wolfpack
- name: WOLFPACK_GRPC_GRACE_S
  value: {{ sub $root.Values.terminationGracePeriodSeconds 5 | quote }}
{{- if not .noAdmin }}
- name: WOLFPACK_ADMIN_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "wolfpack.secretName" $root }}
      key: admin-secret
{{- end }}
{{- with $root.Values.secrets.apiKeys }}
{{- if .existingSecret }}
{{- range $var, $key := .env }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.secrets.apiKeys.existingSecret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end }}
{{- if $root.Values.tracing.enabled }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: "http://{{ $full }}-otel-collector:4317"
- name: OTEL_SERVICE_NAME
  value: "wolfpack-{{ .name }}"
{{- end }}
{{- $env := merge (deepCopy (.svc.env | default dict)) $root.Values.env }}
{{- range $k, $v := $env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- /* Addresses of the release's gRPC services (WOLFPACK_<SERVICE>_ADDR). */ -}}
{{- define "wolfpack.addrEnv" -}}
{{- $root := . -}}
{{- $full := include "wolfpack.fullname" . -}}
{{- range $other, $o := $root.Values.services }}
{{- if $o.enabled }}
- name: WOLFPACK_{{ upper $other }}_ADDR
  value: "{{ $full }}-{{ $other }}:{{ $root.Values.grpcPort }}"
{{- end }}
{{- end }}
{{- end -}}

{{- /* The training config as a mapping (training.configYaml parsed, else training.config). */ -}}
{{- define "wolfpack.trainingConfig" -}}
{{- if .Values.training.configYaml -}}
{{- .Values.training.configYaml -}}
{{- else -}}
{{- toYaml .Values.training.config -}}
{{- end -}}
{{- end -}}

{{- /* "true" when the training Job serves TrainerService itself (local mode, or stack=cluster); then a
Service named <release>-trainer points at it. With its own stack (service mode, stack=job) the job's
child stack already runs a trainer service inside the pod, on a port of its own. */ -}}
{{- define "wolfpack.trainerServes" -}}
{{- $t := .Values.training -}}
{{- $cfg := fromYaml (include "wolfpack.trainingConfig" .) -}}
{{- $mode := (($cfg.rollout | default dict).mode) | default "local" -}}
{{- if and $t.enabled (not $t.ray.kuberay.enabled) (not (and (eq $mode "service") (eq $t.stack "job"))) -}}
true
{{- end -}}
{{- end -}}

{{- /* gRPC health probes: a startupProbe sized by the component (model loads), then readiness/liveness. */ -}}
{{- define "wolfpack.grpcProbes" -}}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{- /* Writable volumes of a read-only root filesystem: /tmp, the run dir and the cache. */ -}}
{{- define "wolfpack.writableMounts" -}}
- name: tmp
  mountPath: /tmp
- name: run
  mountPath: /var/lib/wolfpack
- name: cache
  mountPath: /var/cache/wolfpack
{{- end -}}

{{- define "wolfpack.scheduling" -}}
{{- $ns := .svc.nodeSelector | default .root.Values.nodeSelector -}}
{{- $tol := .svc.tolerations | default .root.Values.tolerations -}}
{{- $aff := .svc.affinity | default .root.Values.affinity -}}
{{- with $ns }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tol }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $aff }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}
