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

{{/*
Refuses to render images older than the chart: a chart's templates and injection config expect
the manager and sidecar of its own appVersion (flags, config keys, the exec agent's init
container), and an older image fails in ways that are hard to trace back to the tag. Only tags
that read as versions are compared (a digest or a name like `latest` is the user's choice).
*/}}
{{- define "podprobe.imagesNotOlder" -}}
{{- $chart := .Chart.AppVersion -}}
{{- $version := `^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$` -}}
{{- $sidecar := .Values.injection.config.image | default "" -}}
{{- $images := dict "image.tag" (.Values.image.tag | toString) "injection.config.image" (regexFind `[^:/@]+$` (regexFind `:[^:/@]+$` $sidecar)) -}}
{{- range $value, $tag := $images }}
{{- if and (regexMatch $version $tag) (semverCompare (printf "<%s" $chart) $tag) }}
{{- fail (printf "%s: tag %s is older than this chart (%s): the chart's templates and injection expect the manager and sidecar of %s (CHANGELOG.md). Build the images from the chart's own commit (charts/podprobe/README.md, \"Install\", step 0) or install the chart released with %s." $value $tag $chart $chart $tag) }}
{{- end }}
{{- end }}
{{- end }}
