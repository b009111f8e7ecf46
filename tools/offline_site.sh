#!/usr/bin/env bash
# Copy the pure-Python packages lra.train needs beyond torch and lightning (hydra-core, omegaconf,
# antlr4-python3-runtime; submitit and the launcher plugin for sweeps) from this checkout's .venv into
# .whl/site (git-ignored), for a GPU node that has torch but no network (docs/facts.md §10):
#   tools/offline_site.sh && WHEELS=$PWD/.whl/site bash tools/gpu_window.sh ...
set -eu
S=$(ls -d .venv/lib/python3*/site-packages)
rm -rf .whl/site && mkdir -p .whl/site
for p in hydra omegaconf antlr4 hydra_plugins submitit cloudpickle typing_extensions.py \
         hydra_core-*.dist-info omegaconf-*.dist-info antlr4_python3_runtime-*.dist-info submitit-*.dist-info \
         hydra_submitit_launcher-*.dist-info cloudpickle-*.dist-info; do
  cp -r "$S"/$p .whl/site/
done
find .whl/site -name __pycache__ -prune -exec rm -rf {} +
du -sh .whl/site
