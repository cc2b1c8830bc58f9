{{/*
Names, labels and the operator's RBAC rules, shared by every template.
Object names are cut at 63 characters (the DNS label limit some name fields have).
*/}}

{{- define "finetune-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-chart, or just the release when it already contains the chart name.
*/}}
{{- define "finetune-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A name derived from the full name with a suffix, still within 63 characters.
Call with (list $ "suffix").
*/}}
{{- define "finetune-operator.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $base := include "finetune-operator.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base $suffix }}
{{- end }}

{{- define "finetune-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "finetune-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finetune-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "finetune-operator.labels" -}}
helm.sh/chart: {{ include "finetune-operator.chart" . }}
{{ include "finetune-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: finetune-operator
{{- end }}

{{- define "finetune-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "finetune-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "finetune-operator.image" -}}
{{- $image := .Values.operator.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "finetune-operator.trainerImage" -}}
{{- printf "%s:%s" .Values.operator.trainerImage.repository (default .Chart.AppVersion .Values.operator.trainerImage.tag) }}
{{- end }}

{{/*
True ("true") when the operator itself creates a PodMonitor per job: it then gets --pod-monitor
and the podmonitors permission.
*/}}
{{- define "finetune-operator.perJobPodMonitor" -}}
{{- if and .Values.podMonitor.enabled .Values.podMonitor.perJob }}true{{ end }}
{{- end }}

{{/*
The Restricted Pod Security Standard, for every container of this chart.
*/}}
{{- define "finetune-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Exactly the permissions in operator/finetune_operator/handlers/permissions.py (REQUIRED, plus
OPTIONAL when the operator creates PodMonitors). tests/unit/test_chart.py proves the match.
Secrets are absent on purpose.
*/}}
{{- define "finetune-operator.rules" -}}
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["serving.kserve.io"]
  resources: ["llminferenceservices"]
  verbs: ["get", "create", "patch"]
{{- if include "finetune-operator.perJobPodMonitor" . }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- if .Values.kueue.enabled }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}
