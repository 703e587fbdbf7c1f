{{/* The webhooks' "gpuwarden-may-act" matchCondition for the policies in .Values.policies: the
fixed parts from _scope.tpl (generated from gpuwarden/policy/render/scope.py), joined with the label and
annotation keys of every workload rule that may give GPUs to a pod that asks for none. It mirrors
ReviewScope.cel(); tests/chart/test_scope.py checks both agree for every test values file. */}}
{{- define "gpuwarden.scope.expression" -}}
{{- $evidence := include "gpuwarden.scope.evidence" . | fromJson -}}
{{- $labels := list -}}
{{- $annotations := list -}}
{{- $every := false -}}
{{- range $doc := include "gpuwarden.policyDocuments" . | fromJsonArray -}}
{{- range $rule := default list $doc.workloads -}}
{{- if not (or $rule.skip $rule.requireGpuRequest (hasKey $rule "maxGpuRequest")) -}}
{{- $match := default dict $rule.match -}}
{{- if eq (default "" $match.kind) "selector" -}}
{{- $keys := list -}}
{{- with $match.labels -}}
{{- range $key, $_ := default dict .matchLabels -}}{{- $keys = append $keys $key -}}{{- end -}}
{{- range $req := default list .matchExpressions -}}
{{- if has $req.operator (list "In" "Exists") -}}{{- $keys = append $keys $req.key -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $keys) (not $match.annotations) -}}
{{- $every = true -}}
{{- else -}}
{{- $labels = concat $labels $keys -}}
{{- range $key, $_ := default dict $match.annotations -}}{{- $annotations = append $annotations $key -}}{{- end -}}
{{- end -}}
{{- else -}}
{{- $kind := get $evidence (default "" $match.kind) -}}
{{- $labels = concat $labels (default list $kind.labels) -}}
{{- $annotations = concat $annotations (default list $kind.annotations) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $create := "true" -}}
{{- if not $every -}}
{{- $parts := list -}}
{{- range $key := $labels | uniq | sortAlpha -}}
{{- $parts = append $parts (printf "(has(object.metadata.labels) && %q in object.metadata.labels)" $key) -}}
{{- end -}}
{{- range $key := $annotations | uniq | sortAlpha -}}
{{- $parts = append $parts (printf "(has(object.metadata.annotations) && %q in object.metadata.annotations)" $key) -}}
{{- end -}}
{{- $parts = append $parts (include "gpuwarden.scope.pod" .) -}}
{{- $create = join " || " $parts -}}
{{- end -}}
{{- printf "request.operation == \"UPDATE\" ? (%s) : (%s)" (include "gpuwarden.scope.update" .) $create -}}
{{- end -}}
