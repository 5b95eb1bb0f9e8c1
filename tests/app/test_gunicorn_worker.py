"""When the buffering worker (app/gunicorn_worker.py) has a whole request, and what it hands over
unbuffered."""

from app.gunicorn_worker import BUFFER_MAX, HEAD_MAX, wanted

HEAD = b"POST /wecom/callback?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\nContent-Type: t\r\n\r\n"


def test_a_content_length_body_is_awaited_whole():
    assert wanted(HEAD) == len(HEAD) + 20
    assert wanted(HEAD + b"x" * 5) == len(HEAD) + 20
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    assert wanted(get) == len(get)


def test_a_head_still_arriving_is_awaited():
    assert wanted(HEAD[:30]) == -1
    assert wanted(b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * (HEAD_MAX // 8)) is None  # gunicorn refuses it


def test_what_a_thread_gets_at_once():
    for header in (b"Transfer-Encoding: chunked", b"Expect: 100-continue",
                   b"Content-Length: 1\r\nContent-Length: 2", b"Content-Length: %d" % (BUFFER_MAX + 1)):
        assert wanted(b"POST / HTTP/1.1\r\n" + header + b"\r\n\r\n") is None, header
