{{/* The namespaces the policies' tenants list by name (spec.tenants[].namespaces of
.Values.policies), sorted, without those never governed: a JSON list. A namespace without the
labels of webhook.namespaceSelector would never reach the webhooks, so each pod webhook has a
second entry selecting these by name (gpuwarden.webhook.podEntries). */}}
{{- define "gpuwarden.tenantNamespaces" -}}
{{- $w := .Values.webhook -}}
{{- $never := uniq (concat (list .Release.Namespace) $w.excludedNamespaces) -}}
{{- $names := list -}}
{{- range $doc := include "gpuwarden.policyDocuments" . | fromJsonArray -}}
{{- range $tenant := $doc.tenants -}}
{{- range $ns := default list $tenant.namespaces -}}
{{- if not (has $ns $never) -}}{{- $names = append $names $ns -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson ($names | uniq | sortAlpha) -}}
{{- end -}}

{{/* The entries of one webhook named NAME (e.g. mutate.gpuwarden.io): itself, selecting namespaces
by webhook.namespaceSelector, and, when that selector has matchLabels and tenants list namespaces
by name, NAME with "-named" after its first label, selecting those namespaces by name. A
namespaceSelector's terms are ANDed, so one entry cannot select "the label OR the name". With a
single matchLabels key the second entry also requires the namespace to lack it, so a labelled,
listed namespace is sent once; with several keys it may be sent to both (the mutating webhook's
second answer is then an empty patch). */}}
{{- define "gpuwarden.webhook.entries" -}}
{{- $ := .root -}}
{{- $entries := list (dict "name" .name "named" list) -}}
{{- $named := include "gpuwarden.tenantNamespaces" $ | fromJsonArray -}}
{{- if and $named $.Values.webhook.namespaceSelector.matchLabels -}}
{{- $parts := splitn "." 2 .name -}}
{{- $entries = append $entries (dict "name" (printf "%s-named.%s" $parts._0 $parts._1) "named" $named) -}}
{{- end -}}
{{- toJson $entries -}}
{{- end -}}
