"""The chart's Prometheus rules, as rendered, through Prometheus's own promtool.

``promtool check rules`` parses every expression; ``promtool test rules`` runs the unit tests in
``promtool/*.test.yaml`` (input series, expected recorded values, alerts firing and not). The
tests cover every recording rule and alert the chart renders (checked here, so a new rule comes
with a test).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from .support import VALUES, template

TESTS = Path(__file__).resolve().parent / "promtool"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2e.prometheus import built_tool  # noqa: E402


@cache
def promtool() -> Path:
    return built_tool("PROMTOOL")


def rendered_groups(*values: Path) -> list[dict[str, object]]:
    sets = {"monitoring.prometheusRule.enabled": "true"}
    rule = template(values, sets).one("PrometheusRule")
    groups: list[dict[str, object]] = rule["spec"]["groups"]
    return groups


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The chart's rules (defaults) as rules.yaml, next to copies of the unit tests."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rendered_groups()}))
    for test in TESTS.glob("*.test.yaml"):
        shutil.copy(test, tmp_path / test.name)
    return tmp_path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("values", [(), (VALUES / "tenants-quotas.yaml",)], ids=["defaults", "set"])
def test_promtool_checks_the_rendered_rules(tmp_path: Path, values: tuple[Path, ...]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rendered_groups(*values)}))
    result = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass(rules_dir: Path) -> None:
    tests = sorted(p.name for p in rules_dir.glob("*.test.yaml"))
    result = run_promtool("test", "rules", *tests, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fail_on_a_wrong_value(rules_dir: Path) -> None:
    """The tests do check values: one expected figure changed makes promtool fail."""
    test = rules_dir / "usage.test.yaml"
    text = test.read_text()
    assert "            value: 0.390625\n" in text
    test.write_text(text.replace("            value: 0.390625\n", "            value: 0.39\n", 1))
    result = run_promtool("test", "rules", test.name, cwd=rules_dir)
    assert result.returncode != 0
    assert "gpuwarden:tenant_gpu_efficiency" in result.stdout + result.stderr


def test_every_rule_the_chart_renders_has_a_unit_test() -> None:
    tested_alerts: set[str] = set()
    tested_exprs = ""
    for path in TESTS.glob("*.test.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested_alerts |= {a["alertname"] for a in case.get("alert_rule_test", [])}
            tested_exprs += "".join(f"{e['expr']}\n" for e in case.get("promql_expr_test", []))
    rules = [rule for group in rendered_groups() for rule in group["rules"]]  # type: ignore[attr-defined]
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert alerts - tested_alerts == set(), "alerts without a promtool test"
    # Recording rules that only feed others are tested through them.
    records = {
        r["record"]
        for r in rules
        if "record" in r and not r["record"].startswith("gpuwarden:container_")
    }
    untested = {
        r for r in records if not re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", tested_exprs)
    }
    assert untested == set(), "recording rules without a promtool test"
