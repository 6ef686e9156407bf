#!/usr/bin/env bash
# The bench's own environment for bench_vs_textarena.py: TextArena from PyPI in bench/env/.venv, apart from
# the project's venv (its pins — openai, rich, nltk — are not the project's to carry).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
test -x "$here/.venv/bin/python" || "$python" -m venv "$here/.venv"
"$here/.venv/bin/python" -m pip install --quiet "textarena==0.7.4"
"$here/.venv/bin/python" -c "import textarena; print('textarena', textarena.__version__ if hasattr(textarena, '__version__') else '0.7.4', 'ready in', '$here/.venv')"
