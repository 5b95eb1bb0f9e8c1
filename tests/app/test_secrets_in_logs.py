"""No secret and no message text ever lands in a log, the database or Redis.

One run through the real stack with sentinel values: the CorpSecret, callback token, AES key,
data keys, blind-index key, SECRET_KEY, an API key, an admin password, the access_token WeCom
issued, and a message text (which the fake model echoes into the reply). Then every captured log
(gunicorn with its access log, the Celery worker and beat, the in-process emulator and test
servers), a pg_dump of the database (the knowledge base's tables too, with a document holding
the text) and every Redis value are searched for them.
"""

import glob
import logging
import re
import secrets
import subprocess

import pytest
import requests

from app.db import Database
from app.security import BlindIndex
from app.web.admin.accounts import create_user
from app.web.api.keys import create_key
from tests.support.faults import KILL_DB
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.faults

MARK = secrets.token_hex(6)


def random_sentinel(name: str) -> str:
    """A sentinel that is also a valid random secret: base64 whose first characters spell it."""
    value = f"SENTINEL{name}{MARK}" + secrets.token_urlsafe(48)
    return value + "x" * (-len(value) % 4)


SENTINELS = {
    "WECOM_SECRET": f"SENTINELcorpsecret{MARK}",
    "WECOM_TOKEN": f"SENTINELtoken{MARK}",
    "SECRET_KEY": random_sentinel("secretkey"),
    "BLIND_INDEX_KEY": random_sentinel("blindindex"),
}
TEXT = f"SENTINEL机密消息{MARK}"
PASSWORD = f"SENTINELpassword{MARK}"


@pytest.fixture(scope="module")
def captured():
    """Everything this process logs (the emulator, the fake model server, werkzeug)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep(logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield records
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, captured):
    s = Stack(tmp_path_factory.mktemp("secrets"), db_kind="postgres", redis_db=KILL_DB,
              extra_env={**SENTINELS, "WEB_ACCESS_LOG": "-", "SESSION_COOKIE_SECURE": "false",
                         "WEB_LOG_LEVEL": "debug"})
    s.start()
    yield s
    s.stop()


def pg_dump(url: str) -> str:
    from sqlalchemy.engine import make_url

    parts = make_url(url)  # the stack's database, on DATA_TEST_PG's server
    binary = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump"))[-1]
    return subprocess.run([binary, "-h", parts.host, "-p", str(parts.port or 5432), "-U", parts.username,
                           "--inserts", parts.database],
                          check=True, capture_output=True, text=True, timeout=120).stdout


def test_no_secret_or_message_text_in_logs_database_or_redis(stack, captured):
    env = stack.env
    user = stack.emu("GET", "directory")["users"][0]["userid"]
    db = Database(stack.db.url)
    with db.transaction() as session:
        _, api_key = create_key(session, BlindIndex(env["BLIND_INDEX_KEY"]), "secrets-test", 100)
        create_user(session, "ops", "admin", PASSWORD)

    stack.send(user, TEXT)
    wait_for(lambda: any(TEXT in r for r in stack.replies(user)), timeout=60, what="the answer")
    wait_for(lambda: stack.outbox_rows()[-1]["status"] == "answered", timeout=30, what="answered")

    # A knowledge base document holding the text: sealed, its index keyed term hashes only.
    from app.knowledge.store import KnowledgeStore
    from app.services import Services
    from tests.support.env import settings_from

    KnowledgeStore(Services(settings_from(env), db)).add(
        f"# {TEXT} 手册\n\n## {TEXT}\n\n{TEXT} 内部条款 bonus.\n".encode(), f"{TEXT} 手册",
        filename=f"{TEXT}.md", departments=[2])

    base = stack.callback_url.rsplit("/wecom/", 1)[0]
    api = requests.post(f"{base}/v1/chat/completions", timeout=30,
                        headers={"Authorization": f"Bearer {api_key}"},
                        json={"model": "fake-glm", "messages": [{"role": "user", "content": TEXT}]})
    assert api.status_code == 200 and TEXT in api.json()["choices"][0]["message"]["content"]
    browser = requests.Session()
    page = browser.get(f"{base}/admin/login", timeout=10).text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page).group(1)
    signed_in = browser.post(f"{base}/admin/login", timeout=10, allow_redirects=False,
                             data={"name": "ops", "password": PASSWORD, "csrf_token": token})
    assert signed_in.status_code == 302
    access_token = stack.redis.get(next(stack.redis.scan_iter("wecom:access_token:*"))).decode()

    secrets_ = {**SENTINELS, "WECOM_AES_KEY": env["WECOM_AES_KEY"],
                "DATA_KEYS": env["DATA_KEYS"].split(":", 1)[1], "api key": api_key,
                "admin password": PASSWORD, "access_token": access_token}
    stack.stop_processes()  # flush and close every log
    places = {name: stack.log(name) for name in ("web", "worker", "beat")}
    places["in-process (emulator, model)"] = "\n".join(captured)
    places["database dump"] = pg_dump(stack.db.url)
    places["redis"] = "\n".join(repr(stack.redis.dump(k)) for k in stack.redis.scan_iter())
    assert "inbound_messages" in places["database dump"] and "POST /wecom/callback" in places["web"]
    assert "kb_chunks" in places["database dump"] and "kb_postings" in places["database dump"]
    assert "Task worker.tasks.handle_message" in places["worker"]
    assert "message/send msgid=" in places["in-process (emulator, model)"]  # the capture works

    # The access_token's one home is the shared token cache in Redis (app/wecom/client.py).
    found = [(what, where) for what, value in secrets_.items() for where, text in places.items()
             if value in text and (what, where) != ("access_token", "redis")]
    assert found == []
    text_found = [where for where, text in places.items()
                  if TEXT in text and where != "in-process (emulator, model)"]
    assert text_found == []  # only WeCom (the emulator) and the model server may see the text
