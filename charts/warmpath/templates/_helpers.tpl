{{/* Common names and labels. */}}
{{- define "warmpath.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The controller's name: the Deployment, its ServiceAccount, its Service and its leader Lease. Cut at 63
characters as it always was (a valid DNS label however long the release name): a rule that cut the base instead
would rename these on upgrade of a long-named release, and old and new pods would lead under different Leases. */}}
{{- define "warmpath.controller.name" -}}
{{- printf "%s-controller" (include "warmpath.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<base>-<suffix>", the base cut so that the whole fits in 63 characters (a DNS label: Service names must be one,
and a Job's name becomes a label value). Called with (list <base> <suffix>). */}}
{{- define "warmpath.suffixed" -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (index . 0 | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}

{{/* The name of one of the release's objects: (list . <suffix>) after the fullname, within 63 characters. */}}
{{- define "warmpath.fullname.with" -}}
{{- include "warmpath.suffixed" (list (include "warmpath.fullname" (index . 0)) (index . 1)) -}}
{{- end -}}

{{/* The name of one of the controller's objects: (list . <suffix>) after the controller's name, within 63
characters. */}}
{{- define "warmpath.controller.with" -}}
{{- include "warmpath.suffixed" (list (include "warmpath.controller.name" (index . 0)) (index . 1)) -}}
{{- end -}}

{{- define "warmpath.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "warmpath.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "warmpath.controller.image" -}}
{{- printf "%s:%s" .Values.controller.image.repository (default .Chart.AppVersion .Values.controller.image.tag) -}}
{{- end -}}

{{- define "warmpath.agent.image" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) -}}
{{- end -}}
