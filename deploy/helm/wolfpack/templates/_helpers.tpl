{{- define "wolfpack.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "wolfpack.labels" -}}
app.kubernetes.io/part-of: wolfpack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "wolfpack.redisUrl" -}}
{{- if .Values.redis.url -}}
{{ .Values.redis.url }}
{{- else -}}
redis://{{ include "wolfpack.fullname" . }}-redis:6379/0
{{- end -}}
{{- end -}}
