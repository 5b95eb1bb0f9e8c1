"""The API as it runs, for tests and bench/api.py: gunicorn serving ``app.web.factory:create_app()`` with
``INFERENCE_BACKEND=openai`` pointed at the fake model server, a fresh SQLite file or PostgreSQL
database, Redis DB 13."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import openai
import redis
import requests

from app import migrate
from app.db import Database
from app.security import BlindIndex
from app.web.api.keys import create_key
from tests.support.env import make_env, redis_url
from tests.support.openai_server import FakeOpenAIServer
from tests.support.stack import BIN, ROOT, TempDatabase, free_port, terminate_group, wait_for

MODEL = "fake-glm"
REDIS_URL = redis_url(13)


class ApiServer:
    def __init__(self, tmp: Path, workers: int = 2, threads: int = 4, model_delay_s: float = 0.0,
                 db_kind: str = "sqlite"):
        self.temp_db = TempDatabase(db_kind, tmp)
        self.db_url = self.temp_db.url
        migrate.upgrade(self.db_url)
        self.db = Database(self.db_url)
        self.model = FakeOpenAIServer(delay_s=model_delay_s).start()
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.redis.flushdb()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = make_env(DATABASE_URL=self.db_url, REDIS_URL=REDIS_URL)
        self.env.update({"INFERENCE_BACKEND": "openai", "OPENAI_BASE_URL": self.model.url,
                         "OPENAI_MODEL": MODEL, "WEB_BIND": f"127.0.0.1:{port}", "WEB_WORKERS": str(workers),
                         "WEB_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                         # the fake model server answers at once; a dead one fails fast
                         "OPENAI_TIMEOUT_S": "10"})
        self.blind_index = BlindIndex(self.env["BLIND_INDEX_KEY"])
        self.log_path = tmp / "gunicorn.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(BIN / "gunicorn"), "app.web.factory:create_app()"], cwd=ROOT,
                                         env={**os.environ, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, 60, what="gunicorn")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def new_key(self, rate_limit: int = 1000) -> tuple[str, str]:
        name = f"app-{uuid.uuid4().hex[:8]}"
        with self.db.transaction() as session:
            _, key = create_key(session, self.blind_index, name, rate_limit)
        return name, key

    def client(self, key: str, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(api_key=key, base_url=f"{self.url}/v1", max_retries=0, timeout=20,
                             **kwargs)

    def stop(self) -> None:
        terminate_group(self.proc)
        self.model.stop()
        self.redis.flushdb()
        self.redis.close()
        self.db.dispose()
        self.temp_db.drop()
