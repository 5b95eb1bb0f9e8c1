"""Published config.json files of GLM models for `python -m inference plan --config` (README.md
says where each came from)."""

from pathlib import Path

CONFIGS_DIR = Path(__file__).resolve().parent
