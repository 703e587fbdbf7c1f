{{/*
Render-time check of the policies against files/gpupolicy.schema.json, the JSON Schema that
hack/update-docs.py generates from the pydantic model (gpuwarden/policy/spec/model.py). Helm checks
a policy given as a mapping against values.schema.json (the same definitions) before any
template runs, but it cannot see into a policy given as YAML text (--set-file): this does, for
both, so a typo fails `helm template`/`helm install` instead of leaving the webhook unready.
"gpuwarden.policies" (_helpers.tpl), through which every template reads the policies, runs it.

What the schema holds: field names (unknown fields), types, enums, required fields, union tags
(backend.type, match.kind), numeric bounds and patterns. What only `gpuwarden serve` checks at
start (its readiness probe then names the problem): quantity syntax (8Gi), DNS-label names,
references between fields (defaultProfile, a rule's profile, a tenant's profiles), duplicates
and the other cross-field rules in the model's validators.
*/}}

{{/* The JSON Schema type of a value (fromYaml gives numbers as float64, --set as int64). */}}
{{- define "gpuwarden.jsonType" -}}
{{- if kindIs "invalid" . -}}null
{{- else if kindIs "map" . -}}object
{{- else if kindIs "slice" . -}}array
{{- else if kindIs "string" . -}}string
{{- else if kindIs "bool" . -}}boolean
{{- else if has (kindOf .) (list "int" "int8" "int16" "int32" "int64" "uint" "uint8" "uint16" "uint32" "uint64") -}}integer
{{- else if has (kindOf .) (list "float32" "float64") -}}{{ ternary "integer" "number" (eq (float64 .) (floor .)) }}
{{- else -}}{{ kindOf . }}
{{- end -}}
{{- end -}}

{{/* Problems of .value against the schema node .schema (definitions in .defs), as a JSON list
of "<path>: <message>" lines. Implements the keywords gpuwarden.policy.spec.schema.PORTABLE_KEYWORDS
lists, which are all the generated schema uses: $ref, type, const, enum, minimum, maximum,
pattern, properties, required, additionalProperties, items, anyOf (only [X, null]) and
discriminator (a tagged union: dispatch on the tag; with "string" in its type, the tag alone is
a shorthand for {tag: value}). */}}
{{- define "gpuwarden.schemaProblems" -}}
{{- $defs := .defs -}}
{{- $v := .value -}}
{{- $path := .path -}}
{{- $at := ternary "" (printf "%s: " $path) (eq $path "") -}}
{{- $s := .schema -}}
{{- if hasKey $s "$ref" -}}
{{- $s = get $defs (trimPrefix "#/$defs/" (get $s "$ref")) -}}
{{- end -}}
{{- $type := include "gpuwarden.jsonType" $v -}}
{{- $problems := list -}}
{{- if hasKey $s "anyOf" -}}
  {{- if ne $type "null" -}}
  {{- $problems = include "gpuwarden.schemaProblems" (dict "schema" (first $s.anyOf) "value" $v "path" $path "defs" $defs) | fromJsonArray -}}
  {{- end -}}
{{- else if hasKey $s "discriminator" -}}
  {{- $tag := $s.discriminator.propertyName -}}
  {{- $mapping := $s.discriminator.mapping -}}
  {{- $choices := keys $mapping | sortAlpha | join ", " -}}
  {{- $shorthand := has "string" (ternary (list $s.type) $s.type (kindIs "string" $s.type)) -}}
  {{- if and (eq $type "string") $shorthand -}}
    {{- if not (hasKey $mapping $v) -}}
    {{- $problems = append $problems (printf "%smust be one of %s, got %s" $at $choices (toJson $v)) -}}
    {{- end -}}
  {{- else if ne $type "object" -}}
  {{- $problems = append $problems (printf "%smust be an object%s, got %s" $at (ternary (printf " or one of %s" $choices) "" $shorthand) $type) -}}
  {{- else if not (hasKey $v $tag) -}}
  {{- $problems = append $problems (printf "%smissing required field %q (one of %s)" $at $tag $choices) -}}
  {{- else if not (and (kindIs "string" (get $v $tag)) (hasKey $mapping (get $v $tag))) -}}
  {{- $problems = append $problems (printf "%s: must be one of %s, got %s" (ternary $tag (printf "%s.%s" $path $tag) (eq $path "")) $choices (toJson (get $v $tag))) -}}
  {{- else -}}
  {{- $problems = include "gpuwarden.schemaProblems" (dict "schema" (dict "$ref" (get $mapping (get $v $tag))) "value" $v "path" $path "defs" $defs) | fromJsonArray -}}
  {{- end -}}
{{- else -}}
  {{- $want := list -}}
  {{- if hasKey $s "type" -}}{{- $want = ternary (list $s.type) $s.type (kindIs "string" $s.type) -}}{{- end -}}
  {{- if and $want (not (or (has $type $want) (and (eq $type "integer") (has "number" $want)))) -}}
  {{- $problems = append $problems (printf "%smust be %s, got %s" $at (join " or " $want) $type) -}}
  {{- else -}}
    {{- if and (hasKey $s "const") (not (deepEqual $v $s.const)) -}}
    {{- $problems = append $problems (printf "%smust be %s, got %s" $at (toJson $s.const) (toJson $v)) -}}
    {{- end -}}
    {{- if and (hasKey $s "enum") (not (has $v $s.enum)) -}}
    {{- $problems = append $problems (printf "%smust be one of %s, got %s" $at (join ", " $s.enum) (toJson $v)) -}}
    {{- end -}}
    {{- if has $type (list "integer" "number") -}}
      {{- if and (hasKey $s "minimum") (lt (float64 $v) (float64 $s.minimum)) -}}
      {{- $problems = append $problems (printf "%smust be at least %s, got %s" $at (toJson $s.minimum) (toJson $v)) -}}
      {{- end -}}
      {{- if and (hasKey $s "maximum") (gt (float64 $v) (float64 $s.maximum)) -}}
      {{- $problems = append $problems (printf "%smust be at most %s, got %s" $at (toJson $s.maximum) (toJson $v)) -}}
      {{- end -}}
    {{- end -}}
    {{- if and (eq $type "string") (hasKey $s "pattern") (not (regexMatch $s.pattern $v)) -}}
    {{- $problems = append $problems (printf "%smust match %s, got %s" $at $s.pattern (toJson $v)) -}}
    {{- end -}}
    {{- if and (eq $type "array") (hasKey $s "items") -}}
      {{- range $i, $item := $v -}}
      {{- $problems = concat $problems (include "gpuwarden.schemaProblems" (dict "schema" $s.items "value" $item "path" (printf "%s[%d]" $path $i) "defs" $defs) | fromJsonArray) -}}
      {{- end -}}
    {{- end -}}
    {{- if eq $type "object" -}}
      {{- $properties := default dict $s.properties -}}
      {{- range $name := default list $s.required -}}
      {{- if not (hasKey $v $name) -}}
      {{- $problems = append $problems (printf "%smissing required field %q" $at $name) -}}
      {{- end -}}
      {{- end -}}
      {{- range $name, $child := $v -}}
      {{- $childPath := ternary $name (printf "%s.%s" $path $name) (eq $path "") -}}
      {{- if hasKey $properties $name -}}
      {{- $problems = concat $problems (include "gpuwarden.schemaProblems" (dict "schema" (get $properties $name) "value" $child "path" $childPath "defs" $defs) | fromJsonArray) -}}
      {{- else if kindIs "map" $s.additionalProperties -}}
      {{- $problems = concat $problems (include "gpuwarden.schemaProblems" (dict "schema" $s.additionalProperties "value" $child "path" $childPath "defs" $defs) | fromJsonArray) -}}
      {{- else if and (hasKey $s "additionalProperties") (not $s.additionalProperties) -}}
      {{- $problems = append $problems (printf "%s: unknown field (allowed here: %s)" $childPath (keys $properties | sortAlpha | join ", ")) -}}
      {{- end -}}
      {{- end -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- toJson $problems -}}
{{- end -}}

{{/* .Values.policies as a JSON list of {"key", "docs"}: each value's documents, YAML text split
and parsed (numbered as the loader numbers them: text before a leading --- is no document), a
mapping as one document. Fails on a key gpuwarden would not read and on text that is no YAML. */}}
{{- define "gpuwarden.policyFiles" -}}
{{- $files := list -}}
{{- range $key, $value := default dict .Values.policies -}}
{{- if not (regexMatch "\\.(ya?ml|json)$" $key) -}}
{{- fail (printf "policies.%s: keys are file names and must end in .yaml, .yml or .json (gpuwarden reads only those)" $key) -}}
{{- end -}}
{{- $docs := list -}}
{{- if kindIs "string" $value -}}
  {{- range $i, $text := regexSplit "(?m)^---[ \t]*$" $value -1 -}}
  {{- $doc := fromYaml $text -}}
  {{- if hasKey $doc "Error" -}}
  {{- fail (printf "policies.%s: not valid YAML, or not a mapping: %s" $key (get $doc "Error")) -}}
  {{- end -}}
  {{- if or $doc (ne $i 0) -}}{{- $docs = append $docs $doc -}}{{- end -}}
  {{- end -}}
{{- else if kindIs "map" $value -}}
  {{- $docs = list $value -}}
{{- else -}}
  {{- fail (printf "policies.%s must be YAML text or a mapping" $key) -}}
{{- end -}}
{{- $files = append $files (dict "key" $key "docs" $docs) -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* Fails the render, naming every problem, when a policy does not match the schema. A
document is read as the loader reads it: with kind or apiVersion a GPUPolicy (a ConfigMap of
policy files is left to the start-time check), without either a bare spec. */}}
{{- define "gpuwarden.checkPolicies" -}}
{{- $defs := get (.Files.Get "files/gpupolicy.schema.json" | fromJson) "$defs" -}}
{{- if not $defs -}}
{{- fail "files/gpupolicy.schema.json is missing from the chart (run hack/update-docs.py)" -}}
{{- end -}}
{{- $problems := list -}}
{{- range $file := include "gpuwarden.policyFiles" . | fromJsonArray -}}
{{- range $i, $doc := $file.docs -}}
  {{- $prefix := printf "policies.%s" $file.key -}}
  {{- if gt (len $file.docs) 1 -}}{{- $prefix = printf "%s: document %d" $prefix (add1 $i) -}}{{- end -}}
  {{- $root := "" -}}
  {{- if not (or (hasKey $doc "kind") (hasKey $doc "apiVersion")) -}}{{- $root = "PolicySpec" -}}
  {{- else if ne (toString $doc.kind) "ConfigMap" -}}{{- $root = "GPUPolicy" -}}
  {{- end -}}
  {{- if and $doc $root -}}
  {{- range $line := include "gpuwarden.schemaProblems" (dict "schema" (dict "$ref" (printf "#/$defs/%s" $root)) "value" $doc "path" "" "defs" $defs) | fromJsonArray -}}
  {{- $problems = append $problems (printf "%s: %s" $prefix $line) -}}
  {{- end -}}
  {{- end -}}
{{- end -}}
{{- end -}}
{{- if $problems -}}
{{- fail (printf "invalid policies (checked against files/gpupolicy.schema.json, generated from the policy model); gpuwarden would refuse them, its webhook would never become ready and, with failurePolicy Fail, pods in governed namespaces would be refused:\n  %s" (join "\n  " $problems)) -}}
{{- end -}}
{{- end -}}

{{/* What NOTES.txt says about the policies, as JSON: "backends", the scheduler backends they
use (spec.backend.type, volcano when unset, and each profile's own; native for the chart's empty
policy), sorted; "tenants", how many tenants they define. */}}
{{- define "gpuwarden.policySummary" -}}
{{- $backends := list -}}
{{- $tenants := 0 -}}
{{- range $file := include "gpuwarden.policyFiles" . | fromJsonArray -}}
{{- range $doc := $file.docs -}}
  {{- $spec := dict -}}
  {{- if eq (toString $doc.kind) "GPUPolicy" -}}{{- $spec = default dict $doc.spec -}}
  {{- else if not (or (hasKey $doc "kind") (hasKey $doc "apiVersion")) -}}{{- $spec = $doc -}}
  {{- end -}}
  {{- if $spec -}}
  {{- $tenants = add $tenants (len (default list $spec.tenants)) -}}
  {{- $named := list (default (dict "type" "volcano") $spec.backend) -}}
  {{- range $profile := default list $spec.profiles -}}
  {{- with $profile.backend -}}{{- $named = append $named . -}}{{- end -}}
  {{- end -}}
  {{- range $backend := $named -}}
  {{- /* A backend is {type: ...} or its shorthand, the type alone. */ -}}
  {{- if kindIs "string" $backend -}}{{- $backends = append $backends $backend -}}
  {{- else -}}{{- $backends = append $backends $backend.type -}}
  {{- end -}}
  {{- end -}}
  {{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "backends" (default (list "native") ($backends | uniq | sortAlpha)) "tenants" $tenants) -}}
{{- end -}}
