#!/usr/bin/env bash
# Regenerates the files under deploy/ that come from the configuration (run after changing
# deploy/kubernetes/base/granary.yaml), then renders every overlay to check it still builds:
#   deploy/kubernetes/overlays/gpu/worker-tiers.yaml  <- worker.tieredstore.levels
# Usage: scripts/render-deploy.sh [BUILD_DIR]   (tests/deploy/deploy_test.py checks the output is current)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build}/bin
cd "$ROOT"
"$BIN/granary" deploy worker-tiers --config deploy/kubernetes/base/granary.yaml > deploy/kubernetes/overlays/gpu/worker-tiers.yaml
for o in base overlays/gpu overlays/prometheus-operator; do
  kubectl kustomize "deploy/kubernetes/$o" > /dev/null
done
yamllint -s -c deploy/.yamllint deploy
echo "deploy/ is current"
