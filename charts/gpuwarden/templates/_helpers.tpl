{{/* Chart name, shortened to a DNS label. */}}
{{- define "gpuwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-gpuwarden unless the release name already says gpuwarden. It also
names both webhook configurations, which `gpuwarden certs` patches by that name. */}}
{{- define "gpuwarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuwarden.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpuwarden.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "gpuwarden.nodeAgent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "gpuwarden.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpuwarden.webhook.serviceAccount" -}}{{ include "gpuwarden.fullname" . }}-webhook{{- end -}}
{{- define "gpuwarden.nodeAgent.serviceAccount" -}}{{ include "gpuwarden.fullname" . }}-node-agent{{- end -}}
{{- define "gpuwarden.tlsSecret" -}}{{ include "gpuwarden.fullname" . }}-tls{{- end -}}
{{- define "gpuwarden.policiesConfigMap" -}}{{ include "gpuwarden.fullname" . }}-policies{{- end -}}

{{/* The TLS mode, refusing anything but the two supported ones. */}}
{{- define "gpuwarden.tlsMode" -}}
{{- $mode := .Values.tls.mode -}}
{{- if not (has $mode (list "cert-manager" "self-managed")) -}}
{{- fail (printf "tls.mode must be cert-manager or self-managed, got %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* The policies to install: .Values.policies, or one that governs nothing when it is empty.
Every template reads the policies through here, so a policy that does not match the schema
fails the render here first, with its problems named (_policy-check.tpl). */}}
{{- define "gpuwarden.policies" -}}
{{- include "gpuwarden.checkPolicies" . -}}
{{- if .Values.policies -}}
{{- toJson .Values.policies -}}
{{- else -}}
{{- $empty := dict "apiVersion" "gpuwarden.io/v1alpha1" "kind" "GPUPolicy" "metadata" (dict "name" "empty") "spec" (dict "backend" (dict "type" "native")) -}}
{{- toJson (dict "empty.yaml" $empty) -}}
{{- end -}}
{{- end -}}

{{/* "true" when a policy in .Values.policies names the nvidia backend (spec.backend or a
profile's backend: `type: nvidia`), the only backend that shares GPUs through MPS; the node
agent's nodeAgent.mps.daemon auto follows it. */}}
{{- define "gpuwarden.usesMps" -}}
{{- $uses := false -}}
{{- range $key, $value := include "gpuwarden.policies" . | fromJson -}}
{{- $text := ternary $value (toYaml $value) (kindIs "string" $value) -}}
{{- if regexMatch `(?m)\btype:\s*["']?nvidia["']?\s*($|[,}#])` $text -}}
{{- $uses = true -}}
{{- end -}}
{{- end -}}
{{- $uses -}}
{{- end -}}

{{/* nodeAgent.mps.daemon resolved: auto is manage where the policies use the nvidia backend
(the only one that shares GPUs through MPS), off elsewhere (Volcano vGPU and HAMi enforce their
caps with HAMi-core inside the container, where an MPS daemon would serve no pod). */}}
{{- define "gpuwarden.nodeAgent.mpsDaemon" -}}
{{- $daemon := .Values.nodeAgent.mps.daemon | default "auto" -}}
{{- if eq $daemon "auto" -}}
{{- $daemon = ternary "manage" "off" (eq (include "gpuwarden.usesMps" .) "true") -}}
{{- end -}}
{{- if not (has $daemon (list "manage" "external" "off")) -}}
{{- fail (printf "nodeAgent.mps.daemon must be auto, manage, external or off, not %q" $daemon) -}}
{{- end -}}
{{- $daemon -}}
{{- end -}}

{{/* Every GPUPolicy document in .Values.policies, as a JSON list of
{"policy": <name>, "profiles": [...], "workloads": [...], "tenants": [...]}. A value is YAML text (one or more documents) or a
mapping; a document without kind is a bare spec named after its key, as the loader does. */}}
{{- define "gpuwarden.policyDocuments" -}}
{{- $docs := list -}}
{{- range $key, $value := include "gpuwarden.policies" . | fromJson -}}
{{- if not (regexMatch "\\.(ya?ml|json)$" $key) -}}
{{- fail (printf "policies.%s: keys are file names and must end in .yaml, .yml or .json (gpuwarden reads only those)" $key) -}}
{{- end -}}
{{- $parts := list -}}
{{- if kindIs "string" $value -}}
{{- range $text := regexSplit "(?m)^---[ \t]*$" $value -1 -}}
{{- $doc := fromYaml $text -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "policies.%s: not valid YAML: %s" $key (get $doc "Error")) -}}
{{- end -}}
{{- if $doc -}}{{- $parts = append $parts $doc -}}{{- end -}}
{{- end -}}
{{- else if kindIs "map" $value -}}
{{- $parts = append $parts $value -}}
{{- else -}}
{{- fail (printf "policies.%s must be YAML text or a mapping" $key) -}}
{{- end -}}
{{- range $doc := $parts -}}
{{- $kind := default "" $doc.kind -}}
{{- if eq $kind "GPUPolicy" -}}
{{- $docs = append $docs (dict "policy" $doc.metadata.name "profiles" (default list $doc.spec.profiles) "workloads" (default list $doc.spec.workloads) "tenants" (default list $doc.spec.tenants)) -}}
{{- else if eq $kind "" -}}
{{- $stem := regexReplaceAll "\\.(ya?ml|json)$" $key "" | lower -}}
{{- $stem = regexReplaceAll "[^a-z0-9-]+" $stem "-" | trimAll "-" | trunc 53 | trimAll "-" -}}
{{- $docs = append $docs (dict "policy" (default "policy" $stem) "profiles" (default list $doc.profiles) "workloads" (default list $doc.workloads) "tenants" (default list $doc.tenants)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{/* Soft anti-affinity: prefer replicas on different nodes, then different zones. */}}
{{- define "gpuwarden.webhook.affinity" -}}
{{- if .Values.webhook.affinity -}}
{{- toYaml .Values.webhook.affinity -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gpuwarden.webhook.selectorLabels" . | nindent 12 }}
    - weight: 50
      podAffinityTerm:
        topologyKey: topology.kubernetes.io/zone
        labelSelector:
          matchLabels:
            {{- include "gpuwarden.webhook.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* Container securityContext shared by every gpuwarden container that needs no privilege. */}}
{{- define "gpuwarden.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
