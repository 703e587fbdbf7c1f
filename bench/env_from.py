"""The worst pod a tenant can send through envFrom (issue 29 item 2): a ConfigMap of 1 MiB of
keys, named by hundreds of envFrom entries. Before, the environment check sorted and matched
every key of the ConfigMap for every entry (5.1 s for 40,000 keys x 800 entries, on the event
loop); now a ConfigMap's keys are indexed once and each entry is a lookup.

Old and new code run side by side, each in its own process from its own tree: the old one is
the commit before the fix (``--old``, by default the parent of the commit that added
gpuwarden/policy/pod/environment.py), extracted with ``git archive``. For each it prints

* ``decide``: one admission (mutate, patch, validate: the webhook's two decisions) of the pod,
  best of ``--repeat``, with the ConfigMap as the cluster view holds it (the webhook's cache and
  ``--namespaces`` FILE both build it once, when the ConfigMap arrives);
* ``apply``: ``gpuwarden apply`` of the pod offline, the whole command (start, read the
  manifests, decide, print), and of the same pod without envFrom, for reference.

    .venv/bin/python -m bench.env_from            # 1 MiB of keys, 800 and 1,500 entries
    .venv/bin/python -m bench.env_from --quick    # 100 entries, one run: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.old_code import before_adding, extract

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "tenant-a"
CONFIG_MAP = "settings"
#: What a key and its value cost in the ConfigMap's JSON ("KEY_000000":"1",).
_KEY_BYTES = len('"KEY_000000":"1",')

# Run in the tree under test (old or new): both have these entry points.
_DECIDE = """
import json, sys, time
from pathlib import Path
import yaml
from gpuwarden.kube.cluster import load_manifests
from gpuwarden.policy import AdmissionRequest, admit, load_paths
policies = load_paths([Path(sys.argv[1])])
start = time.perf_counter()
view = load_manifests(Path(sys.argv[2]))
loaded = time.perf_counter() - start
pod = yaml.safe_load(Path(sys.argv[3]).read_text())
times = []
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    result = admit(AdmissionRequest("CREATE", pod["metadata"]["namespace"], pod), policies, view)
    times.append(time.perf_counter() - start)
print(json.dumps({"decide": min(times), "load": loaded, "allowed": result.allowed}))
"""


def config_map(size: int) -> tuple[dict[str, Any], int]:
    """A ConfigMap of about ``size`` bytes of harmless keys, and how many keys."""
    count = size // _KEY_BYTES
    data = {f"KEY_{i:06d}": "1" for i in range(count)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": data,
    }, count


def attack_pod(entries: int, prefix: str = "") -> dict[str, Any]:
    """The notebook example with ``entries`` envFrom entries of the ConfigMap; with ``prefix``,
    each entry has its own (``prefix`` and its number)."""
    pod: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "notebook.yaml").read_text())
    if entries:
        pod["spec"]["containers"][0]["envFrom"] = [
            {"configMapRef": {"name": CONFIG_MAP}, **({"prefix": f"{prefix}{i}"} if prefix else {})}
            for i in range(entries)
        ]
    return pod


def decide(tree: Path, policies: str, manifests: Path, pod: Path, repeat: int) -> Any:
    return json.loads(
        run_tree(tree, ["-c", _DECIDE, policies, str(manifests), str(pod), str(repeat)])[1]
    )


def run_tree(tree: Path, argv: Sequence[str]) -> tuple[float, str]:
    """Seconds and stdout of ``python argv`` with ``tree``'s gpuwarden first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, check=False, cwd=tree
    )
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # apply exits 1 when it denies
        raise SystemExit(f"{' '.join(argv[:3])} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="git ref of the old code (default: before the fix)")
    parser.add_argument("--bytes", type=int, default=1 << 20, help="ConfigMap size (1 MiB)")
    parser.add_argument("--entries", default="800,1500", help="envFrom entries, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="decisions per measurement")
    parser.add_argument("--quick", action="store_true", help="100 entries, one decision")
    args = parser.parse_args(argv)
    entries = [100] if args.quick else [int(e) for e in args.entries.split(",")]
    repeat = 1 if args.quick else args.repeat
    old_ref = args.old or before_adding("gpuwarden/policy/pod/environment.py")
    with tempfile.TemporaryDirectory(prefix="gpuwarden-envfrom-") as tmp:
        work = Path(tmp)
        trees = {"old": extract(old_ref, work / "old"), "new": ROOT}
        big, keys = config_map(args.bytes)
        namespaces = yaml.safe_load_all((ROOT / "examples" / "namespaces.yaml").read_text())
        manifests = work / "cluster.yaml"
        manifests.write_text(yaml.safe_dump_all([*namespaces, big]))
        policies = str(ROOT / "policies")
        print(
            f"ConfigMap {CONFIG_MAP}: {keys} keys, "
            f"{len(json.dumps(big, separators=(',', ':'))) / 2**20:.2f} MiB; "
            f"old code {old_ref}, new code the working tree; best of {repeat}"
        )
        print(
            f"{'entries':>8} {'pod KiB':>8} | {'decide old':>11} {'new':>9} {'ratio':>7} | "
            f"{'apply old':>10} {'new':>8} {'ratio':>7} | {'plain apply old':>15} {'new':>6}"
        )
        for tree in trees.values():  # compile each tree's modules once, outside the timings
            run_tree(tree, ["-c", "import gpuwarden.cli, gpuwarden.kube.cluster"])
        plain = work / "plain.yaml"
        plain.write_text(yaml.safe_dump(attack_pod(0)))
        plain_apply = {
            name: run_tree(tree, _apply(policies, manifests, plain))[0]
            for name, tree in trees.items()
        }
        for count in entries:
            pod = work / f"pod-{count}.yaml"
            pod.write_text(yaml.safe_dump(attack_pod(count)))
            decided = {
                name: decide(tree, policies, manifests, pod, repeat) for name, tree in trees.items()
            }
            applied = {
                name: run_tree(tree, _apply(policies, manifests, pod))[0]
                for name, tree in trees.items()
            }
            if decided["old"]["allowed"] != decided["new"]["allowed"]:
                raise SystemExit(f"old and new disagree: {decided}")
            old_ms, new_ms = (decided[n]["decide"] * 1e3 for n in ("old", "new"))
            print(
                f"{count:>8} {pod.stat().st_size / 1024:>8.0f} | {old_ms:>9.1f}ms {new_ms:>7.2f}ms "
                f"{old_ms / new_ms:>6.0f}x | {applied['old']:>9.2f}s {applied['new']:>7.2f}s "
                f"{applied['old'] / applied['new']:>6.1f}x | {plain_apply['old']:>14.2f}s "
                f"{plain_apply['new']:>5.2f}s"
            )
        # The worst pod for the new code: every entry its own prefix that makes every key a
        # denied variable (CUDA_MPS_<n>), so nothing is shared between entries. The old code
        # built a violation per key per entry (61,680 each): it is timed on a few entries.
        worst = work / "worst.yaml"
        worst.write_text(yaml.safe_dump(attack_pod(max(entries), "CUDA_MPS_")))
        few = work / "few.yaml"
        few.write_text(yaml.safe_dump(attack_pod(10, "CUDA_MPS_")))
        new_worst = decide(trees["new"], policies, manifests, worst, repeat)["decide"]
        old_few = decide(trees["old"], policies, manifests, few, 1)["decide"]
        print(
            f"{max(entries)} entries, each its own CUDA_MPS_<n> prefix: new {new_worst * 1e3:.1f}ms; "
            f"old {old_few:.2f}s for 10 such entries ({old_few * max(entries) / 10:.0f}s at "
            f"{max(entries)} by its linear cost per entry)"
        )
        loads = {
            name: decide(tree, policies, manifests, plain, 1)["load"]
            for name, tree in trees.items()
        }
        print(
            f"reading the manifests (YAML and the ConfigMap's index, once): old {loads['old']:.2f}s, "
            f"new {loads['new']:.2f}s"
        )
    return 0


def _apply(policies: str, manifests: Path, pod: Path) -> list[str]:
    return [
        "-c",
        "import sys; from gpuwarden.cli import main; sys.exit(main())",
        "apply",
        "-p",
        policies,
        "--namespaces",
        str(manifests),
        "-o",
        "patch",
        str(pod),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
