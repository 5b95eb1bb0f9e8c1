"""When the buffering worker (app/web/gunicorn_worker.py) has a whole request, and what it hands over
unbuffered."""

from app.web.gunicorn_worker import BUFFER_MAX, CHUNKED, HEAD_MAX, ChunkScanner, wanted

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
    for header in (b"Transfer-Encoding: gzip, chunked", b"Expect: 100-continue",
                   b"Transfer-Encoding: chunked\r\nExpect: 100-continue",
                   b"Transfer-Encoding: chunked\r\nContent-Length: 5",
                   b"Content-Length: 1\r\nContent-Length: 2", b"Content-Length: %d" % (BUFFER_MAX + 1)):
        assert wanted(b"POST / HTTP/1.1\r\n" + header + b"\r\n\r\n") is None, header


CHUNKED_HEAD = b"POST /admin/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
BODY = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"


def test_a_chunked_body_is_awaited_whole_however_it_trickles():
    assert wanted(CHUNKED_HEAD) == CHUNKED
    whole = CHUNKED_HEAD + BODY
    scanner = ChunkScanner(len(CHUNKED_HEAD))
    buf = bytearray(CHUNKED_HEAD)
    ends = []
    for byte in BODY:  # a byte at a time, as a slow client sends it
        buf.append(byte)
        ends.append(scanner.end(buf))
    assert ends[:-1] == [-1] * (len(BODY) - 1) and ends[-1] == len(whole)
    assert ChunkScanner(len(CHUNKED_HEAD)).end(bytearray(whole + b"GET / HTTP/1.1\r\n")) == len(whole)


def test_malformed_chunking_goes_to_gunicorn_to_refuse():
    for body in (b"zz\r\nhello\r\n", b"5\r\nhelloXX0\r\n\r\n", b"1" * 2000, b"-5\r\nhello\r\n"):
        assert ChunkScanner(len(CHUNKED_HEAD)).end(bytearray(CHUNKED_HEAD + body)) is None, body
