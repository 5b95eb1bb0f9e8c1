"""The baseline for bench/callback.py: a bare Flask endpoint under the same gunicorn config."""

from flask import Flask, Response, request

app = Flask(__name__)


@app.post("/wecom/callback")
def callback():
    request.get_data()
    return Response("", status=200, mimetype="text/plain")


@app.get("/healthz")
def healthz():
    return {"status": "ok"}
