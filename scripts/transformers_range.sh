#!/usr/bin/env bash
# Run the tests that touch Trainer internals against each transformers release in the supported range.
#
#   scripts/transformers_range.sh [VERSION ...]      # default: every release the pin admits
#
# Each version is installed (without dependencies) into its own folder under .transformers-range/ and put
# first on PYTHONPATH of the project's venv (.venv, made by the README's test command), so everything else
# stays as pinned. Not part of CI (it downloads one wheel per version and runs the trainer tests once per
# version); the `transformers` pin in pyproject.toml is the range this script passed.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(5.19.0 5.20.0 5.20.1 5.20.2 5.21.0 5.21.1 5.22.0 5.22.1 5.22.2 5.23.0 5.24.0)
tests=(tests/test_trainer_fidelity.py tests/test_trainer_phases.py tests/test_checkpoint.py tests/test_args.py
       tests/test_peft.py tests/test_precision.py tests/test_telemetry.py tests/test_extension_api.py
       tests/test_console.py tests/test_model_card.py)
status=0
for version in "${versions[@]}"; do
  target=".transformers-range/$version"
  [ -d "$target/transformers" ] || pip install -q --no-deps --target "$target" "transformers==$version"
  found=$(PYTHONPATH="$target" python -c "import transformers; print(transformers.__version__)" 2>/dev/null)
  if [ "$found" != "$version" ]; then echo "transformers $version: could not be imported (got '$found')"; status=1; continue; fi
  if PYTHONPATH="$target" OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider "${tests[@]}" > "$target.log" 2>&1; then
    echo "transformers $version: passed ($(tail -1 "$target.log"))"
  else
    echo "transformers $version: FAILED (see $target.log)"; tail -5 "$target.log"; status=1
  fi
done
exit $status
