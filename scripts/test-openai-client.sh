#!/usr/bin/env bash
# Run the official `openai` Python client against an OpenAI-compatible server.
# Usage: scripts/test-openai-client.sh BASE_URL   (e.g. http://127.0.0.1:8011/v1)
# Uses (and creates if needed) a virtualenv in ./.venv with the `openai` package.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 BASE_URL" >&2
    exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai>=1.40"
fi
exec "$venv/bin/python" "$root/crates/hayai-server/tests/openai_client.py" "$1"
