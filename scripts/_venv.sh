# Sourced by the other scripts: make sure .venv exists and holds this package.
# Usage: . scripts/_venv.sh [extra]   (extra: the optional-dependency group, e.g. dev)
set -euo pipefail
extra="${1:-}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "awa needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=".venv/.awa-installed${extra:+-$extra}"
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
# The dev extra holds every other extra: a venv set up for the tests serves the demo too.
if ! fresh "$stamp" && ! fresh .venv/.awa-installed-dev; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".${extra:+[$extra]}"
    touch "$stamp"
fi
