"""Regenerate what the policy model generates: the field table of docs/reference.md, the chart's
CRD, the chart's values.schema.json (which Helm checks `policies` against) and
files/gpupolicy.schema.json (which the chart's templates check policies given as YAML text
against), and templates/_scope.tpl (the fixed parts of the webhooks' matchConditions); and every
command output shown in README.md and docs/ under an ``<!-- output: COMMAND -->`` marker, from
running the command now (tests/docs holds them equal, so they cannot drift)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from gpuwarden.policy.render.scope import chart_template
from gpuwarden.policy.spec.schema import (
    crd_yaml,
    policy_document_schema,
    policy_field_table,
    schema_json,
    values_schema,
)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
CHART = ROOT / "charts" / "gpuwarden"
CRD = CHART / "crds" / "gpupolicies.gpuwarden.io.yaml"
VALUES_SCHEMA = CHART / "values.schema.json"
POLICY_SCHEMA = CHART / "files" / "gpupolicy.schema.json"
SCOPE_TEMPLATE = CHART / "templates" / "_scope.tpl"
DASHBOARD = CHART / "files" / "dashboard.json"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"


def with_field_table(text: str) -> str:
    """text (docs/reference.md) with the table between the markers generated anew."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{policy_field_table().rstrip()}\n{END}{tail}"


def _dashboard_json() -> str:
    """hack/dashboard.py's dashboard (loaded by path: this script is not imported as a package)."""
    spec = importlib.util.spec_from_file_location(
        "dashboard", Path(__file__).parent / "dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module.dashboard_json()
    return text


def generated_files() -> dict[Path, str]:
    """Every file generated from the model but docs/reference.md, with its content (and the
    chart's Grafana dashboard, generated with Grafana's foundation SDK)."""
    return {
        CRD: crd_yaml(),
        VALUES_SCHEMA: schema_json(values_schema()),
        POLICY_SCHEMA: schema_json(policy_document_schema()),
        SCOPE_TEMPLATE: chart_template(),
        DASHBOARD: _dashboard_json(),
    }


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it; whether it wrote."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


# --- shown command output --------------------------------------------------------------------

# A fenced text block that shows what COMMAND prints (stderr and stdout, as a terminal shows them),
# run from the repository's root. `COMMAND | grep -E 'REGEX'` shows only the lines that match,
# with `...` where lines were left out. Two commands are not run as such: `make run` (the log
# lines up to serving, timestamps as ...) and `gpuwarden review FILE` (the webhook's /mutate
# answer, computed by the server's own code without the network).
OUTPUT_BLOCK = re.compile(
    r"(?P<head><!-- output: (?P<command>.+?) -->\n```text\n)(?P<body>.*?)(?P<tail>```\n)", re.S
)
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@contextlib.contextmanager
def _at_root() -> Iterator[None]:
    """Run from the repository's root, as the commands shown are (paths in the output, and the
    policy fingerprint, which hashes the paths given, are those a user sees)."""
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(cwd)


def _run_cli(argv: list[str]) -> str:
    from gpuwarden.cli import main as cli

    out = io.StringIO()
    with _at_root(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        cli(argv)
    return out.getvalue()


def _make_run_log() -> str:
    """The log lines `make run` writes up to serving, each as the webhook formats it."""
    from gpuwarden.policy import load_paths
    from gpuwarden.webhook.logs import JSONFormatter

    with _at_root():
        policies = load_paths(["policies"])  # as `make run` gives them
    events = [
        ("issued a new CA and serving certificate in .cache/certs", None),
        (
            "policies loaded",
            {"fingerprint": policies.fingerprint, "profiles": len(policies.profiles)},
        ),
    ]
    lines = []
    for message, fields in events:
        record = logging.LogRecord("gpuwarden.webhook", logging.INFO, "", 0, message, None, None)
        if fields:
            record.fields = fields
        line = json.loads(JSONFormatter().format(record))
        line["ts"] = "..."
        lines.append(json.dumps(line, separators=(",", ":")))
    lines.append(
        '{"ts":"...","level":"info","logger":"gpuwarden.webhook","msg":"serving",'
        '"address":"https://127.0.0.1:8443","metrics":9090,"policies":["policies"],...}'
    )
    return "\n".join(lines) + "\n"


def _review(source: str) -> str:
    """What `gpuwarden review SOURCE` prints against `make run`: the server's decision and
    encoding (gpuwarden.webhook.decide, .review), without the network."""
    from gpuwarden.commands._inputs import load_cluster
    from gpuwarden.commands.review import answer_of, label_of, summary
    from gpuwarden.policy import load_paths
    from gpuwarden.webhook.decide import decide
    from gpuwarden.webhook.review import decode, encode

    body = (ROOT / source).read_bytes()
    review = decode(body)
    policies = load_paths([ROOT / "policies"])
    cluster = load_cluster([str(ROOT / "examples" / "namespaces.yaml")])
    decision = decide("mutate", review, policies, cluster)
    answer = answer_of(encode(review, decision, mutating=True))
    return "\n".join(summary(label_of(json.loads(body)), source, "mutate", answer)) + "\n"


def command_output(command: str) -> str:
    """What a marked block shows for ``command``."""
    command, _, grep = command.partition(" | grep -E ")
    argv = shlex.split(command)
    if argv == ["make", "run"]:
        text = _make_run_log()
    elif argv[:2] == ["gpuwarden", "review"] and len(argv) == 3:
        text = _review(argv[2])
    elif argv[0] == "gpuwarden":
        text = _run_cli(argv[1:])
    else:
        raise ValueError(f"cannot show the output of {command!r}")
    if not grep:
        return text
    pattern = re.compile(shlex.split(grep)[0])
    shown: list[str] = []
    for line in text.splitlines():
        if pattern.search(line):
            shown.append(line)
        elif not shown or shown[-1] != "...":
            shown.append("...")
    return "".join(f"{line}\n" for line in shown)


def with_outputs(text: str) -> str:
    """Markdown ``text`` with every marked output block generated anew."""
    return OUTPUT_BLOCK.sub(lambda m: m["head"] + command_output(m["command"]) + m["tail"], text)


def main() -> int:
    wanted = {REFERENCE: with_field_table(REFERENCE.read_text()), **generated_files()}
    for path in MARKDOWN:
        wanted[path] = with_outputs(wanted.get(path, path.read_text()))
    written = [path for path, text in wanted.items() if write_if_changed(path, text)]
    if written:
        print("updated " + ", ".join(str(path.relative_to(ROOT)) for path in written))
    else:
        print(f"unchanged: {len(wanted)} generated files are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
