#!/usr/bin/env bash
# The embedded default, end to end on this machine's CPU, with nothing downloaded but the pinned packages:
#   1. install requirements.txt into .venv (Python 3.9-3.11; TensorFlow 2.15 supports no newer),
#   2. tokenize this Python's own standard library with the tokenizer shipped in data/tokenizers/,
#   3. train configs/default.json (about 5 minutes on 2 cores; resumes if run again),
#   4. sample from the checkpoint.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else
  "error: needs Python 3.9-3.11 (TensorFlow 2.15); run with PYTHON=/path/to/python3.11 bash quickstart.sh")'
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
