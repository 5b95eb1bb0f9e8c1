"""Question sets for `python -m inference.demo.eval --questions` (never read by the trainer).

`new_wordings.jsonl`: the test set (issue #24's Show). `dev.jsonl`: settings (thresholds, biases)
are chosen on this one, in wordings of its own, its out-of-scope questions near the handbook's
topics ("年假可以折现吗", "可以带孩子来办公室吗"): the kind a weak match lets through.
"""

from pathlib import Path

from app.knowledge.evaluate import load_questions

SETS = tuple(Path(__file__).resolve().parent / name for name in ("new_wordings.jsonl", "dev.jsonl"))


def questions() -> set[str]:
    """Every question of the sets: what the checks that no trainer sees one compare against."""
    return {item["question"] for path in SETS for item in load_questions(path)}
