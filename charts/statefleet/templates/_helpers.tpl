{{- define "statefleet.labels" -}}
app.kubernetes.io/name: statefleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}
{{- define "statefleet.selector" -}}
app.kubernetes.io/name: statefleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
