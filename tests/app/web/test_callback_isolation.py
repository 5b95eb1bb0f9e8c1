"""/v1 cannot starve the WeCom callbacks: the issue's probe, against the stack as ``make run``
starts it (``scripts.run_stack.web_programs``: a gunicorn for the callbacks, one for /v1).

Five streams from one API key (far under its rate limit) against a slow model server: the key's
in-flight limit (``API_MAX_CONCURRENT_PER_KEY=2``) lets two through and refuses three with 429
in OpenAI's shape and a Retry-After; another key's streams fill what is left of the /v1 pool;
WeCom's URL verification is meanwhile answered on the callbacks' service well within WeCom's
5 s (it took the 10 s timeout, 3 of 3, when one gunicorn served both). Once the streams end the
key's slots are free again.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import pytest
import requests

from app import migrate
from app.db import Database
from app.security import BlindIndex
from app.web.api.keys import create_key
from app.wecom.crypto import WeComCrypto
from scripts import run_stack
from tests.support.env import make_env, redis_url
from tests.support.openai_server import FakeOpenAIServer
from tests.support.stack import ROOT, free_port, terminate_group, wait_for

pytestmark = pytest.mark.integration

MODEL_DELAY_S = 8.0
WECOM_LIMIT_S = 5.0
ECHO = "7318462087712655184"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    db_url = f"sqlite:///{tmp / 'bot.sqlite3'}"
    migrate.upgrade(db_url)
    model = FakeOpenAIServer(delay_s=MODEL_DELAY_S).start()
    env = make_env(DATABASE_URL=db_url, REDIS_URL=redis_url(12))
    env.update({"INFERENCE_BACKEND": "openai", "OPENAI_BASE_URL": model.url, "OPENAI_MODEL": "fake-glm",
                "OPENAI_TIMEOUT_S": "30", "WEB_BIND": f"127.0.0.1:{free_port()}",
                "API_BIND": f"127.0.0.1:{free_port()}", "WEB_WORKERS": "1", "WEB_THREADS": "2",
                "API_THREADS": "4", "API_MAX_CONCURRENT_PER_KEY": "2", "PYTHONUNBUFFERED": "1"})
    procs = []
    for program in run_stack.web_programs(env):
        log = open(tmp / f"{program.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        procs.append(subprocess.Popen(program.argv, cwd=ROOT, env={**os.environ, **env, **program.env},
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    urls = {"web": f"http://{env['WEB_BIND']}", "api": f"http://{env['API_BIND']}"}
    try:
        for url in urls.values():
            wait_for(lambda url=url: _up(url), 60, what=f"gunicorn at {url}")
        db = Database(db_url)
        yield {**urls, "env": env, "db": db, "model": model}
        db.dispose()
    finally:
        for proc in procs:
            terminate_group(proc)
        model.stop()


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=1).ok
    except requests.RequestException:
        return False


def new_key(stack) -> str:
    with stack["db"].transaction() as session:
        _, key = create_key(session, BlindIndex(stack["env"]["BLIND_INDEX_KEY"]),
                            f"app-{uuid.uuid4().hex[:8]}", 1000)
    return key


def stream(stack, key: str, results: list) -> None:
    body = {"model": "fake-glm", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    try:
        with requests.post(f"{stack['api']}/v1/chat/completions", json=body, stream=True, timeout=60,
                           headers={"Authorization": f"Bearer {key}"}) as resp:
            results.append((resp.status_code, dict(resp.headers), resp.content))
    except requests.RequestException as exc:
        results.append((None, {}, repr(exc).encode()))


def url_verification(stack) -> tuple[float, requests.Response]:
    env = stack["env"]
    crypto = WeComCrypto(env["WECOM_TOKEN"], env["WECOM_AES_KEY"], env["WECOM_CORP_ID"])
    timestamp, nonce = str(int(time.time())), "n0nce"
    echostr = crypto.encrypt(ECHO)
    started = time.perf_counter()
    resp = requests.get(f"{stack['web']}/wecom/callback", timeout=15, params={
        "msg_signature": crypto.signature(timestamp, nonce, echostr), "timestamp": timestamp,
        "nonce": nonce, "echostr": echostr})
    return time.perf_counter() - started, resp


def test_a_busy_v1_leaves_the_url_verification_fast_and_one_key_holds_only_its_share(stack):
    first, other = new_key(stack), new_key(stack)
    mine: list = []
    threads = [threading.Thread(target=stream, args=(stack, first, mine)) for _ in range(5)]
    for t in threads:
        t.start()
    wait_for(lambda: len(mine) >= 3, 10, what="the key's three refusals")
    theirs: list = []  # another key takes the rest of the /v1 pool (4 threads)
    threads += [threading.Thread(target=stream, args=(stack, other, theirs)) for _ in range(2)]
    for t in threads[5:]:
        t.start()
    wait_for(lambda: stack["model"].in_flight == 4, 10, what="the /v1 pool busy with the slow model")
    refused = [r for r in mine if r[0] == 429]
    assert len(refused) == 3, [r[:1] for r in mine]
    for _, headers, body in refused:
        assert 1 <= int(headers["Retry-After"]) <= 30
        error = requests.models.complexjson.loads(body)["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "concurrency_limit_exceeded"
        assert "API_MAX_CONCURRENT_PER_KEY" in error["message"]

    took = []
    for _ in range(3):
        seconds, resp = url_verification(stack)
        assert resp.status_code == 200 and resp.text == ECHO, resp.text[:200]
        took.append(seconds)
    print(f"URL verification with /v1 busy: {', '.join(f'{s * 1000:.0f} ms' for s in took)}")
    assert max(took) < WECOM_LIMIT_S / 2, took
    assert len(mine) == 3 and not theirs  # the admitted streams still wait on the model

    for t in threads:
        t.join(60)
    assert [r[0] for r in mine].count(200) == 2 and [r[0] for r in theirs] == [200, 200]
    again: list = []
    stream(stack, first, again)  # the key's slots were given back when its streams closed
    assert again[0][0] == 200 and b"[DONE]" in again[0][2]


def test_the_callbacks_service_does_not_serve_v1_and_the_api_no_callbacks(stack):
    resp = requests.get(f"{stack['web']}/v1/models", timeout=5)
    assert resp.status_code == 404
    assert "served by the API service" in resp.json()["error"]["message"]
    assert requests.get(f"{stack['api']}/wecom/callback", timeout=5).status_code == 404
    assert requests.get(f"{stack['api']}/admin/login", timeout=5).status_code == 404
