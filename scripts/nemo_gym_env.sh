#!/usr/bin/env bash
# NeMo Gym's own environment, for the nemo_gym_bridge tests: nemo-gym 0.7.0 requires Python >= 3.13.14,
# and a CPython 3.13 runs it when installed with --ignore-requires-python. Does nothing if the
# environment already imports nemo_gym; says so and exits 0 where no Python 3.13 is found (the tests
# then skip, saying why).
set -euo pipefail
venv=${1:-.venv-nemo-gym}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import nemo_gym, resources_servers" 2>/dev/null; then
  exit 0
fi
py=""
for candidate in $(ls -d "$HOME"/.pyenv/versions/3.13*/bin/python 2>/dev/null | sort -V -r) $(command -v python3.13 || true); do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null; then
    py=$candidate
    break
  fi
done
if [ -z "$py" ]; then
  echo "no Python 3.13 here: the NeMo Gym servers' tests will be skipped"
  exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --ignore-requires-python nemo-gym==0.7.0
