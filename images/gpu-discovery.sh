#!/usr/bin/env bash
# Spark resource discovery script for NVIDIA GPUs.
#
# Spark standalone workers run it when `spark.worker.resource.gpu.amount` is set
# (with `spark.worker.resource.gpu.discoveryScript` pointing here) and expect one
# JSON object on stdout:  {"name": "gpu", "addresses": ["0", "1"]}
# Tasks then read `TaskContext.get().resources()["gpu"].addresses`.
#
# Without nvidia-smi (no GPU, or the NVIDIA container runtime is not in use) it
# prints an empty address list and explains why on stderr, so the worker fails
# with Spark's own "found 0 gpu" message instead of a JSON parse error.
set -eo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-discovery: nvidia-smi not found; run the container with the NVIDIA runtime (compose/gpu.yaml)" >&2
    echo '{"name": "gpu", "addresses": []}'
    exit 0
fi

addresses=""
while read -r index; do
    [ -n "$index" ] || continue
    addresses+="${addresses:+, }\"${index}\""
done < <(nvidia-smi --query-gpu=index --format=csv,noheader)

echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
