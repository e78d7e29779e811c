{{/* The chart name, truncated to the 63 characters a label allows. */}}
{{- define "localmodel-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name, plus the chart name unless it already contains it. */}}
{{- define "localmodel-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "localmodel-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "localmodel-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "localmodel-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "localmodel-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "localmodel-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "localmodel-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The node probe's name (its ServiceAccount, ClusterRole, binding and DaemonSet). */}}
{{- define "localmodel-operator.probeName" -}}
{{- printf "%s-probe" (include "localmodel-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The node probe DaemonSet's name. Chart 0.1.0 named it probeName, with a
selector the operator Deployment's selector also matched; a selector cannot
change, so this one has another name (an upgrade replaces the DaemonSet). */}}
{{- define "localmodel-operator.probeDaemonSetName" -}}
{{- printf "%s-node-probe" (include "localmodel-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The probe's pods: another app.kubernetes.io/name than the operator's, so the
operator Deployment's selector (name and instance) does not match them. */}}
{{- define "localmodel-operator.probeSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-node-probe" (include "localmodel-operator.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-probe
{{- end }}

{{/* The operator's rules on namespaced resources: in its ClusterRole, or with
`namespaces` set in a Role in each of them (namespaced-roles.yaml). */}}
{{- define "localmodel-operator.namespacedRules" -}}
# The LocalModel API: watched (kopf lists, then watches); only status is written
# (server-side apply on the status subresource).
- apiGroups: ["localmodel.dev"]
  resources: ["localmodels"]
  verbs: ["list", "watch"]
- apiGroups: ["localmodel.dev"]
  resources: ["localmodels/status"]
  verbs: ["patch"]
# Engine pods: created, and deleted to roll or re-place them (never patched).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# Weights claims: created once per replica; ownership re-applied when
# storage.retain flips; deleted only when owned and unused.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The Service and the tuned Modelfile ConfigMap (removed by garbage collection).
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch"]
# Each model's NetworkPolicy (render/policy.py): applied like the Service,
# deleted when a model turns it off (else removed by garbage collection).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Placements, decisions and replacements are reported as core Events.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if or .Values.policy.secretLabel .Values.policy.overflowKeySecretLabel }}
# policy.secretLabel: the labels of the Secrets a LocalModel names (its keys
# file, its overflow key), read by GET as metadata only (never listed or watched).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* An image under global.imageRegistry (localmodel/images.py, with_registry:
the registry host replaces the image's, the path and tag are kept; a name
without a host is docker.io's, one component under library/; an image already
under the registry is kept). Called with (list IMAGE REGISTRY). */}}
{{- define "localmodel-operator.withRegistry" -}}
{{- $image := index . 0 -}}
{{- $registry := index . 1 -}}
{{- if or (not $registry) (hasPrefix (printf "%s/" $registry) $image) -}}
{{- $image -}}
{{- else -}}
{{- $parts := splitList "/" $image -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- printf "%s/%s" $registry (rest $parts | join "/") -}}
{{- else if eq (len $parts) 1 -}}
{{- printf "%s/library/%s" $registry $image -}}
{{- else -}}
{{- printf "%s/%s" $registry $image -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The operator's image (the operator and probe pods), under global.imageRegistry. */}}
{{- define "localmodel-operator.image" -}}
{{- $image := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- include "localmodel-operator.withRegistry" (list $image .Values.global.imageRegistry) -}}
{{- end }}

{{/* The gateway's image (and the download step's), under global.imageRegistry. */}}
{{- define "localmodel-operator.gatewayImage" -}}
{{- $repository := .Values.gateway.image.repository | default .Values.image.repository -}}
{{- $tag := .Values.gateway.image.tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{- include "localmodel-operator.withRegistry" (list (printf "%s:%s" $repository $tag) .Values.global.imageRegistry) -}}
{{- end }}

{{/* The names of the pull Secrets: global.imagePullSecrets, then imagePullSecrets, once each. */}}
{{- define "localmodel-operator.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.global.imagePullSecrets }}{{ $names = append $names . }}{{ end -}}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- $names | uniq | join "," -}}
{{- end }}

{{/* The router's name (its ServiceAccount, Deployment, Service and RBAC). */}}
{{- define "localmodel-operator.routerName" -}}
{{- printf "%s-router" (include "localmodel-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The router's pods: their own app.kubernetes.io/name (the operator's selector
does not match them) and the component label a model's NetworkPolicy admits
(contract.ROUTER_POD_LABELS). */}}
{{- define "localmodel-operator.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-router" (include "localmodel-operator.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{/* The namespaces the router serves: router.namespaces, else namespaces (empty: all). */}}
{{/* The Secret holding the router's signing key (the operator makes it; the
router's pods mount it; docs/router.md, The router's signing key). */}}
{{- define "localmodel-operator.routerSigningSecret" -}}
{{- .Values.router.signingSecret | default (printf "%s-router-signing" (include "localmodel-operator.fullname" .)) | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "localmodel-operator.routerNamespaces" -}}
{{- join "," (.Values.router.namespaces | default .Values.namespaces) }}
{{- end }}

{{/* What the router reads, and only reads: the models and their Services'
EndpointSlices (list, then watch; it never gets one by name). */}}
{{- define "localmodel-operator.routerRules" -}}
- apiGroups: ["localmodel.dev"]
  resources: ["localmodels"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
{{- end }}
