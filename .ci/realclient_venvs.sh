#!/usr/bin/env bash
# Build one venv per framework for tests/test_realclients.py under DIR (default .ci-venvs):
# torchtitan 0.2.2, deepspeed 0.19.8, hetu-galvatron 2.4.0 from PyPI (the extras
# realclients-torchtitan/-deepspeed/-galvatron of pyproject.toml), CPU torch==2.13.0 pinned by
# .ci/constraints.txt. Prints the AUTOPAR_<FRAMEWORK>_PYTHON exports the tests read, and the time taken.
# Usage: eval "$(.ci/realclient_venvs.sh [DIR])"
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-.ci-venvs}")
export PIP_CONSTRAINT="$PWD/.ci/constraints.txt" DS_BUILD_OPS=0
start=$(date +%s)
for fw in torchtitan deepspeed galvatron; do
  rm -rf "$dir/$fw"
  python3 -m venv "$dir/$fw"
  # deepspeed and hetu-galvatron build from source: setuptools < 80 for their setup.py, torch first
  "$dir/$fw/bin/pip" install --quiet "setuptools<80" wheel torch==2.13.0 >&2
  "$dir/$fw/bin/pip" install --quiet --no-build-isolation ".[realclients-$fw]" >&2
  echo "export AUTOPAR_${fw^^}_PYTHON=$dir/$fw/bin/python"
done
echo "real-client venvs built in $(( $(date +%s) - start )) s" >&2
