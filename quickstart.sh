#!/usr/bin/env bash
# The embedded default, end to end on this machine's CPU, with nothing downloaded but the pinned packages:
#   1. install requirements.txt into .venv (Python 3.11, 3.12 or 3.13: TensorFlow 2.21's range),
#   2. tokenize this Python's own standard library with the tokenizer shipped in data/tokenizers/,
#   3. train configs/default.json (about 5 minutes on 2 cores; resumes if run again),
#   4. sample from the checkpoint.
set -euo pipefail
cd "$(dirname "$0")"

supported() { "$1" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 13) else 1)' 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  supported "$PYTHON" || { echo "error: PYTHON=$PYTHON is not Python 3.11-3.13 (TensorFlow 2.21 supports those): point PYTHON at one" >&2; exit 1; }
else
  for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && supported "$candidate"; then PYTHON=$candidate; break; fi
  done
  [ -n "${PYTHON:-}" ] || { echo "error: no Python 3.11-3.13 found (TensorFlow 2.21 supports those; python3 is $(python3 --version 2>&1)): install one and run PYTHON=/path/to/python3.12 bash quickstart.sh" >&2; exit 1; }
fi
"$PYTHON" -m venv .venv
.venv/bin/pip install -q -r requirements.txt

STDLIB=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
TOKENIZER=data/tokenizers/stdlib-bpe-4096.json
.venv/bin/python data/create_tfrecords.py --input_dir "$STDLIB" --glob '*.py' --name stdlib \
  --output_dir data/stdlib --encoder_path "$TOKENIZER" --minimum_size 64 --files_per 40 --quiet
.venv/bin/python data/create_tfrecords.py --input_dir "$STDLIB/email" --glob '*.py' --name stdlib_eval \
  --output_dir data/stdlib_eval --encoder_path "$TOKENIZER" --minimum_size 64 --files_per 40 --quiet

.venv/bin/python main.py --model default
.venv/bin/python main.py --model default --predict --prompt data/prompts/default.txt
