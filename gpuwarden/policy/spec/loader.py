"""Load policy sets from YAML: GPUPolicy documents, ConfigMaps holding them, or a bare profiles.yaml.

Loading is all or nothing: every problem is collected with the file, the document index and the
field path (with its line where the field's YAML is read, and the field meant where a name is
misspelled), and a set with any problem is refused whole.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gpuwarden.policy.pod import keys
from gpuwarden.policy.spec.model import (
    BackendName,
    GPUPolicy,
    Matcher,
    Profile,
)
from gpuwarden.policy.spec.policyset import PolicySet

_POLICY_SUFFIXES = (".yaml", ".yml", ".json")
_SPEC_KEYS = {"backend", "profiles", "workloads", "tenants", "defaultProfile", "mps"}
# A policy directory may be a ConfigMap volume: a file per key, each a symlink into ..data.
_MAX_FILE_BYTES = 8 * 1024 * 1024
# Tagged unions put the tag value in pydantic's error locations; these are dropped from paths.
_UNION_TAGS = frozenset(
    [*get_args(BackendName)]
    + [member.model_fields["kind"].default for member in get_args(get_args(Matcher)[0])]
)


@dataclass(frozen=True)
class PolicyIssue:
    """One problem, located as precisely as the input allows."""

    source: str
    document: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source
        if self.document is not None:
            where += f": document {self.document}"
        if self.path:
            where += f": {self.path}"
        return f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy set that cannot be loaded; ``issues`` says every reason."""

    def __init__(self, issues: Sequence[PolicyIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


@dataclass(frozen=True)
class PolicySource:
    """Where a policy document came from."""

    source: str
    document: int | None  # None for an object read from the API server: no file of documents
    prefix: str = ""
    bare: bool = False  # a bare profiles.yaml: its fields sit at the top, not under spec
    node: yaml.Node | None = None  # the document's YAML, for line numbers
    # The file's line number of the text's line 0 (text in a ConfigMap key sits further down the
    # file); None where the text's lines are not the file's (a folded or quoted string).
    line_offset: int | None = 0

    def line(self, path: Sequence[int | str]) -> int | None:
        """The file's line (1-based) of ``path`` in this document, as far as it exists."""
        if self.node is None or self.line_offset is None:
            return None
        if self.bare and path[:1] == ["spec"]:
            path = path[1:]
        return self.line_offset + line_of(self.node, path)

    def where(self) -> str:
        """The source and document, as an issue names them."""
        if self.document is None:
            return self.source
        return f"{self.source}: document {self.document}"

    def issue(self, path: str, message: str) -> PolicyIssue:
        if self.bare:
            path = path.removeprefix("spec.")
        return PolicyIssue(self.source, self.document, _join(self.prefix, path), message)


@dataclass
class _Collector:
    policies: list[tuple[GPUPolicy, PolicySource]] = field(default_factory=list)
    issues: list[PolicyIssue] = field(default_factory=list)
    digest: Any = field(default_factory=hashlib.sha256)


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def format_loc(loc: Iterable[int | str]) -> str:
    """Pydantic's error location as a field path: ``spec.profiles[1].maxMemory``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def compose_documents(text: str) -> list[tuple[Any, yaml.Node | None]]:
    """Each YAML document of ``text`` (as ``yaml.safe_load_all`` reads it) with its node tree,
    which knows the line of every key and item; raises yaml.YAMLError."""
    loader = yaml.SafeLoader(text)
    try:
        out: list[tuple[Any, yaml.Node | None]] = []
        while loader.check_node():
            node = loader.get_node()
            out.append((loader.construct_document(node), node))
        return out
    finally:
        loader.dispose()


def line_of(node: yaml.Node, path: Sequence[int | str]) -> int:
    """The line (1-based) of the key or item at ``path`` under ``node``; where the path leaves
    the document (a field that is missing), the line of the last part that is there."""
    line = node.start_mark.line
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line, node = key.start_mark.line, value
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the choice closest to ``word`` (case aside), else ``""``."""
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]}?" if close else ""


def _members(annotation: Any) -> list[Any]:
    """The types a field's annotation allows, with Annotated, Optional and unions unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [] if annotation is type(None) else [annotation]


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def _tagged(model: type[BaseModel], tag: str) -> bool:
    """Whether ``tag`` is the value of one of the model's Literal fields (a union's tag)."""
    return any(
        get_origin(info.annotation) is Literal and tag in get_args(info.annotation)
        for info in model.model_fields.values()
    )


def _step(annotation: Any, part: int | str) -> Any:
    """The annotation one part of a pydantic error location further in; None where lost."""
    members = _members(annotation)
    models = [member for member in members if _is_model(member)]
    if isinstance(part, str) and len(models) > 1:
        chosen = [model for model in models if _tagged(model, part)]
        return chosen[0] if len(chosen) == 1 else None
    for member in members:
        origin = get_origin(member)
        args = get_args(member)
        if _is_model(member) and isinstance(part, str):
            for name, info in member.model_fields.items():
                if part in (name, info.alias):
                    return info.annotation
        elif origin in (list, tuple, Sequence) and isinstance(part, int) and args:
            return args[0]
        elif origin in (dict, Mapping) and isinstance(part, str) and len(args) == 2:
            return args[1]
    return None


def field_names(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The field names (as written in YAML) of the object at pydantic location ``loc``."""
    annotation: Any = model
    for part in loc:
        if isinstance(part, str) and part.startswith("function-"):
            continue
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    names: set[str] = set()
    for member in _members(annotation):
        if _is_model(member):
            names.update(info.alias or name for name, info in member.model_fields.items())
    return sorted(names)


def _validation_issues(exc: ValidationError, where: PolicySource, base: str) -> list[PolicyIssue]:
    issues = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if not _is_union_tag(part)]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and isinstance(error["loc"][-1], str):
            message += did_you_mean(error["loc"][-1], field_names(GPUPolicy, error["loc"][:-1]))
        line = where.line(loc)
        if line is not None:
            message += f" (line {line})"
        issues.append(where.issue(_join(base, format_loc(loc)), message))
    return issues


def _is_union_tag(part: int | str) -> bool:
    # Tagged unions and before-validators add the tag value and the validator to the location.
    return isinstance(part, str) and (part in _UNION_TAGS or part.startswith("function-"))


def _bare_name(stem: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:53].strip("-")
    return name or "policy"


def _load_document(doc: Any, where: PolicySource, stem: str, out: _Collector) -> None:
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        out.issues.append(where.issue("", f"expected a mapping, got {type(doc).__name__}"))
        return
    kind = doc.get("kind")
    if kind == "ConfigMap":
        _load_configmap(doc, where, out)
        return
    if kind is None and "apiVersion" not in doc:
        unknown = sorted(set(map(str, doc)) - _SPEC_KEYS)
        if unknown:
            line = where.line([unknown[0]])
            out.issues.append(
                where.issue(
                    unknown[0],
                    f"unknown field; a bare policy file may hold only {sorted(_SPEC_KEYS)}"
                    + did_you_mean(unknown[0], _SPEC_KEYS)
                    + (f" (line {line})" if line is not None else ""),
                )
            )
            return
        where = replace(where, bare=True)
        doc = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.POLICY_KIND,
            "metadata": {"name": _bare_name(stem)},
            "spec": dict(doc),
        }
    elif kind != keys.POLICY_KIND or doc.get("apiVersion") != keys.API_VERSION:
        out.issues.append(
            where.issue(
                "kind",
                f"expected apiVersion {keys.API_VERSION} kind {keys.POLICY_KIND} "
                f"(or a ConfigMap holding one), got {doc.get('apiVersion')}/{kind}",
            )
        )
        return
    try:
        policy = GPUPolicy.model_validate(doc)
    except ValidationError as exc:
        out.issues.extend(_validation_issues(exc, where, ""))
        return
    out.policies.append((policy, where))


def _load_configmap(doc: Mapping[str, Any], where: PolicySource, out: _Collector) -> None:
    data = doc.get("data") or {}
    meta = doc.get("metadata")
    name = str((meta.get("name") if isinstance(meta, Mapping) else None) or "configmap")
    if not isinstance(data, Mapping):
        out.issues.append(where.issue("data", "must be a mapping of file names to contents"))
        return
    policy_keys = [key for key in sorted(map(str, data)) if key.endswith(_POLICY_SUFFIXES)]
    for key in policy_keys:
        text = data[key]
        prefix = f"data[{key!r}]"
        if not isinstance(text, str):
            out.issues.append(where.issue(prefix, "must be a string holding YAML"))
            continue
        # A bare file is named after the ConfigMap; with several keys, after the key too.
        stem = name if len(policy_keys) == 1 else f"{name}-{Path(key).stem}"
        source = f"{where.source}: document {where.document}: {prefix}"
        _load_text(text, source, stem, out, _block_offset(where, key))
    if not policy_keys:
        out.issues.append(where.issue("data", "holds no *.yaml, *.yml or *.json key"))


def _block_offset(where: PolicySource, key: str) -> int | None:
    """Where the text of a ConfigMap's data key starts in the file: a literal block (``|``)
    keeps its lines, one for one, from the line after its indicator."""
    if where.node is None or where.line_offset is None:
        return None
    data = where.node
    for part in ("data", key):
        if not isinstance(data, yaml.MappingNode):
            return None
        found = [v for k, v in data.value if isinstance(k, yaml.ScalarNode) and k.value == part]
        if not found:
            return None
        data = found[0]
    if not isinstance(data, yaml.ScalarNode) or data.style != "|":
        return None
    return where.line_offset + data.start_mark.line + 1


def _load_text(
    text: str, source: str, stem: str, out: _Collector, line_offset: int | None = 0
) -> None:
    out.digest.update(source.encode())
    out.digest.update(text.encode())
    try:
        docs = compose_documents(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        out.issues.append(PolicyIssue(source, None, "", f"invalid YAML: {at}{problem}"))
        return
    for index, (doc, node) in enumerate(docs, start=1):
        where = PolicySource(source, index, node=node, line_offset=line_offset)
        _load_document(doc, where, stem, out)


def policy_files(paths: Iterable[Path]) -> list[Path]:
    """Every policy file under the given files and directories, in a stable order."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(
                candidate
                for candidate in path.rglob("*")
                if candidate.suffix in _POLICY_SUFFIXES
                and candidate.is_file()
                and not any(part.startswith(".") for part in candidate.relative_to(path).parts)
                and "tests" not in candidate.relative_to(path).parts
            )
        else:
            files.append(path)
    return files


def load_texts(texts: Iterable[tuple[str, str]]) -> PolicySet:
    """Load (source name, YAML text) pairs as one policy set."""
    out = _Collector()
    for source, text in texts:
        _load_text(text, source, Path(source).stem, out)
    return _finish(out)


def load_paths(paths: Iterable[Path | str]) -> PolicySet:
    """Load files and directories (multi-document YAML) as one policy set."""
    out = _Collector()
    requested = [Path(p) for p in paths]
    for path in requested:
        if not path.exists():
            out.issues.append(PolicyIssue(str(path), None, "", "no such file or directory"))
    files = policy_files(p for p in requested if p.exists())
    if not files and not out.issues:
        out.issues.append(
            PolicyIssue(", ".join(map(str, requested)), None, "", "no policy files found")
        )
    for file in files:
        try:
            if file.stat().st_size > _MAX_FILE_BYTES:
                out.issues.append(PolicyIssue(str(file), None, "", "file is larger than 8 MiB"))
                continue
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            out.issues.append(PolicyIssue(str(file), None, "", f"cannot read: {exc}"))
            continue
        _load_text(text, str(file), file.stem, out)
    return _finish(out)


def load_objects(base: PolicySet, objects: Iterable[tuple[str, Mapping[str, Any]]]) -> PolicySet:
    """``base`` (a set already loaded: the policy files) with more GPUPolicy documents, given
    parsed (GPUPolicy objects as the API server stores them), loaded after it as one set.

    The objects are cross-checked with ``base`` and with each other in the order given, and a
    name, profile, rule, tenant or ``defaultProfile`` defined twice is reported at the later
    document: so at an object, never at ``base``, which loaded on its own. Each issue names the
    object's source (``gpupolicy/<name>``), with no document index or line: the object is not a
    file to point into.
    """
    out = _Collector()
    out.digest.update(base.fingerprint.encode())
    out.policies += [(policy, PolicySource("policy files", None)) for policy in base.policies]
    for source, doc in objects:
        out.digest.update(f"\0{source}\0".encode())
        out.digest.update(json.dumps(doc, sort_keys=True, default=str).encode())
        _load_document(doc, PolicySource(source, None, line_offset=None), source, out)
    return _finish(out)


def _finish(out: _Collector) -> PolicySet:
    if not out.issues and not out.policies:
        out.issues.append(PolicyIssue("policies", None, "", "no GPUPolicy documents found"))
    if not out.issues:
        out.issues.extend(_cross_check(out.policies))
        out.issues.extend(_one_enforcement_action(out.policies))
    if out.issues:
        raise PolicyError(out.issues)
    return PolicySet.build(
        [policy for policy, _ in out.policies],
        fingerprint=out.digest.hexdigest()[:16],
    )


def _one_enforcement_action(
    policies: Sequence[tuple[GPUPolicy, PolicySource]],
) -> list[PolicyIssue]:
    """spec.enforcementAction holds for the whole set: a second, different one is an error (a
    tenant's own enforcementAction is the way to differ)."""
    first: tuple[str, str] | None = None
    issues: list[PolicyIssue] = []
    for policy, where in policies:
        action = policy.spec.enforcement_action
        if action is None:
            continue
        if first is None:
            first = (action, policy.metadata.name)
        elif action != first[0]:
            issues.append(
                where.issue(
                    "spec.enforcementAction",
                    f"{action}, but policy {first[1]!r} sets {first[0]} for the whole set; "
                    "set one of them, or give tenants their own enforcementAction",
                )
            )
    return issues


def _cross_check(policies: Sequence[tuple[GPUPolicy, PolicySource]]) -> list[PolicyIssue]:
    """References across documents: unique names, and every named profile exists."""
    issues: list[PolicyIssue] = []
    profiles: dict[str, tuple[Profile, PolicySource]] = {}
    seen_policies: dict[str, PolicySource] = {}
    tenants: dict[str, PolicySource] = {}
    rules: dict[str, PolicySource] = {}
    defaults: list[tuple[str, PolicySource]] = []

    def twice(where: PolicySource, path: str, what: str, first: PolicySource) -> PolicyIssue:
        if first.where() == where.where():
            return where.issue(path, f"{what} is defined twice: the same file is loaded twice")
        return where.issue(path, f"{what} is defined twice: here and in {first.where()}")

    for policy, where in policies:
        name = policy.metadata.name
        if name in seen_policies:
            issues.append(twice(where, "metadata.name", f"policy {name!r}", seen_policies[name]))
        seen_policies.setdefault(name, where)
        for i, profile in enumerate(policy.spec.profiles):
            if profile.name in profiles:
                issues.append(
                    twice(
                        where,
                        f"spec.profiles[{i}].name",
                        f"profile {profile.name!r}",
                        profiles[profile.name][1],
                    )
                )
            profiles.setdefault(profile.name, (profile, where))
        for i, rule in enumerate(policy.spec.workloads):
            if rule.name in rules:
                issues.append(
                    twice(
                        where, f"spec.workloads[{i}].name", f"rule {rule.name!r}", rules[rule.name]
                    )
                )
            rules.setdefault(rule.name, where)
        for i, tenant in enumerate(policy.spec.tenants):
            if tenant.name in tenants:
                issues.append(
                    twice(
                        where,
                        f"spec.tenants[{i}].name",
                        f"tenant {tenant.name!r}",
                        tenants[tenant.name],
                    )
                )
            tenants.setdefault(tenant.name, where)
        if policy.spec.default_profile:
            defaults.append((policy.spec.default_profile, where))
    known = sorted(profiles)
    sources = list(dict.fromkeys(where.source for _, where in policies))

    def unknown(name: str, policy: GPUPolicy | None = None) -> str:
        hint = did_you_mean(name, known)
        files = all(where.document is not None for _, where in policies)
        if not hint and files and policy is not None and not policy.spec.profiles:
            # A document that defines no profile of its own (a team's file) uses those of the
            # files loaded with it: profiles are pooled across them.
            together = " ".join(
                ["policies/", *(s for s in sources if not s.startswith("policies/"))]
            )
            hint = (
                "; profiles are shared by the policy files loaded together: if another file "
                f"defines it, load that file too (gpuwarden lint {together})"
            )
        return f"unknown profile {name!r} (known: {', '.join(known) or 'none'}){hint}"

    for policy, where in policies:
        for i, rule in enumerate(policy.spec.workloads):
            if rule.profile and rule.profile not in profiles:
                issues.append(
                    where.issue(f"spec.workloads[{i}].profile", unknown(rule.profile, policy))
                )
        for i, tenant in enumerate(policy.spec.tenants):
            for name in tenant.overrides:
                if name not in profiles:
                    issues.append(
                        where.issue(f"spec.tenants[{i}].overrides[{name!r}]", unknown(name, policy))
                    )
            for j, name in enumerate(tenant.limits.allowed_profiles or ()):
                if name not in profiles:
                    issues.append(
                        where.issue(
                            f"spec.tenants[{i}].limits.allowedProfiles[{j}]", unknown(name, policy)
                        )
                    )
    if not issues:
        issues += _semantic_check(policies, {n: p for n, (p, _) in profiles.items()})
    for name, where in defaults:
        if name not in profiles:
            issues.append(where.issue("spec.defaultProfile", unknown(name)))
    if len(defaults) > 1:
        issues.append(defaults[1][1].issue("spec.defaultProfile", "only one policy may set it"))
    return issues


def settings_problems(
    gpu_share: bool, gpus: int, max_memory: str | None, overcommit_ratio: float
) -> list[tuple[str, str]]:
    """(field, message) for settings that cannot work together."""
    problems = []
    if not gpu_share and overcommit_ratio != 1.0:
        problems.append(
            (
                "overcommitRatio",
                "must be 1.0 for an exclusive profile (gpuShare: false): "
                "whole GPUs cannot be oversubscribed",
            )
        )
    if gpu_share and gpus > 0 and max_memory is None:
        problems.append(("maxMemory", "a shared profile needs a GPU-memory cap"))
    return problems


def _semantic_check(
    policies: Sequence[tuple[GPUPolicy, PolicySource]], profiles: Mapping[str, Profile]
) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    for policy, where in policies:
        for i, profile in enumerate(policy.spec.profiles):
            for field_name, message in settings_problems(
                bool(profile.gpu_share),
                profile.gpus if profile.gpus is not None else 1,
                profile.max_memory,
                profile.overcommit_ratio or 1.0,
            ):
                issues.append(where.issue(f"spec.profiles[{i}].{field_name}", message))
        for i, tenant in enumerate(policy.spec.tenants):
            for name, override in tenant.overrides.items():
                base = profiles[name]

                def pick(attr: str, base: Profile = base, override: object = override) -> object:
                    value = getattr(override, attr)
                    return getattr(base, attr) if value is None else value

                gpus = pick("gpus")
                ratio = pick("overcommit_ratio")
                memory = pick("max_memory")
                for field_name, message in settings_problems(
                    bool(pick("gpu_share")),
                    gpus if isinstance(gpus, int) else 1,
                    memory if isinstance(memory, str) else None,
                    ratio if isinstance(ratio, float) else 1.0,
                ):
                    issues.append(
                        where.issue(
                            f"spec.tenants[{i}].overrides[{name!r}].{field_name}",
                            f"{message} (after the override of profile {name})",
                        )
                    )
    return issues
