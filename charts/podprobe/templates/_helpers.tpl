{{/*
The labels every object of the release carries besides app.kubernetes.io/name and /instance
(which selectors use, so they stay as they are): the chart and app version, who manages them.
Never put these in a selector: they change with every upgrade.
*/}}
{{- define "podprobe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podprobe
{{- end }}
