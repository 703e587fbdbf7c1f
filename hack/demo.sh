#!/usr/bin/env bash
# A five-minute tour of the dry-run CLI on the bundled policies and Kubeflow example pods.
set -euo pipefail
cd "$(dirname "$0")/.."
gw=.venv/bin/gpuwarden
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@" || true; }
step $gw lint policies
step $gw explain --policies policies --namespaces examples/namespaces.yaml examples/kfp-train-step.yaml
step $gw apply --policies policies --namespaces examples/namespaces.yaml -o diff examples/notebook.yaml
step $gw apply --policies policies --namespaces examples/namespaces.yaml -o patch examples/kserve-predictor.yaml
step $gw apply --policies policies --namespaces examples/namespaces.yaml policies/tests/pods/escape-mps-pipe.yaml
step $gw test policies/tests
