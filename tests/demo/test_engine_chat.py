"""The whole WeCom path on the bundled engine and the shipped demo model.

One Celery worker process (threads pool) holds one engine; concurrent employees' questions are
batched into it (with MTP speculative decoding, k=4: greedy answers are the plain ones), and the
answers come from the handbook in the knowledge base, loaded and read as `make run` does (the
model chooses the passage that answers and quotes it): the path employees take. Not its
recitation without a knowledge base, which this 7M-parameter model gets right for about one
question in five (15 of the first 80, 7 Dec 2026), too few for 8 questions to tell.
"""

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from demo.corpus import HANDBOOKS, load_qa
from demo.grounded import DEMO_EMBEDDER, as_environment, demo_reading
from inference.server.embeddings import served_settings
from tests.support.stack import ROOT, Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL_DIR = ROOT / "models" / "demo"


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory):
    # make run's knowledge base: both handbook editions, the demo embedder served over HTTP for
    # dense retrieval, and the demo model's reading (quoting, its thresholds and decline bias)
    with served_settings(ROOT / DEMO_EMBEDDER) as embeddings:
        reading = as_environment({**embeddings, **demo_reading()})
        s = Stack(tmp_path_factory.mktemp("engine"), db_kind="postgres", redis_db=8, extra_env={
            "INFERENCE_BACKEND": "engine", "MODEL_DIR": str(MODEL_DIR), "TEMPERATURE": "0",
            "MAX_NEW_TOKENS": "96", "ENGINE_MAX_NUM_SEQS": "16", "ENGINE_SPECULATIVE_K": "4",
            **reading}).start()
        try:
            for path, title in HANDBOOKS:
                subprocess.run([sys.executable, "-m", "app.cli", "kb", "add", str(path), "--title", title],
                               env=s.env, check=True, capture_output=True)
            yield s
        finally:
            s.stop()


def key_facts(answer: str) -> set[str]:
    """Numbers and extensions are what make an answer checkable."""
    return set(re.findall(r"\d+", answer))


def test_concurrent_employees_share_one_engine_and_get_handbook_answers(engine_stack):
    stack = engine_stack
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][:8]
    items = [q for q in load_qa() if key_facts(q["answer"]) and q["topic"] not in ("greeting", "smalltalk")][:8]

    def ask(pair):
        user, item = pair
        stack.send(user, item["question"], wait=True)

    with ThreadPoolExecutor(len(users)) as pool:
        list(pool.map(ask, zip(users, items, strict=True)))
    wait_for(lambda: all(stack.replies(u) for u in users), timeout=300, interval=1, what="8 engine answers")
    time.sleep(2)
    matched = 0
    for user, item in zip(users, items, strict=True):
        replies = stack.replies(user)
        assert len(replies) == 1 and replies[0].strip(), replies
        matched += bool(key_facts(item["answer"]) & key_facts(replies[0]))
    assert matched >= len(items) - 1, f"only {matched} of {len(items)} answers carried the handbook's facts"
    batch = [int(n) for n in re.findall(r"engine batch size reached (\d+)", stack.log("worker"))]
    assert batch and max(batch) >= 2, "concurrent chats were not batched into the one engine"
    assert "MTP speculative decoding, 4 drafts per step" in stack.log("worker")
