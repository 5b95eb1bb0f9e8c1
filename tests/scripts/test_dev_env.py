"""make run's var/dev.env: made once, and given the variables added since without changing any."""

from __future__ import annotations

from scripts.dev_env import main
from tests.support.env import settings_from


def test_an_older_dev_env_gets_the_export_key_and_keeps_its_secrets(tmp_path, capsys):
    target = tmp_path / "dev.env"
    main(str(target))
    first = target.read_text()
    assert "AUDIT_EXPORT_KEY=" in first and (target.stat().st_mode & 0o777) == 0o600
    older = "".join(line + "\n" for line in first.splitlines() if not line.startswith("AUDIT_EXPORT_KEY="))
    target.write_text(older)
    main(str(target))
    assert target.read_text().startswith(older)  # nothing it had changed
    assert target.read_text().count("AUDIT_EXPORT_KEY=") == 1
    assert "added AUDIT_EXPORT_KEY" in capsys.readouterr().out
    main(str(target))
    assert target.read_text().count("\n") == first.count("\n")


def test_make_run_sets_the_ai_bot_up(tmp_path, monkeypatch):
    """Callback (token, key, name) and long connection (bot id, secret): the settings are made,
    added to an older file, and run_stack supervises the connection against the emulator."""
    from scripts import run_stack

    target = tmp_path / "dev.env"
    main(str(target))
    made = dict(line.split("=", 1) for line in target.read_text().splitlines())
    for name in ("AIBOT_TOKEN", "AIBOT_ENCODING_AES_KEY", "AIBOT_NAME", "AIBOT_BOT_ID", "AIBOT_SECRET"):
        assert made[name], name
    older = "".join(line + "\n" for line in target.read_text().splitlines() if not line.startswith("AIBOT_"))
    target.write_text(older)
    main(str(target))
    assert target.read_text().startswith(older) and target.read_text().count("AIBOT_BOT_ID=") == 1
    monkeypatch.setattr(run_stack, "ROOT", tmp_path)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "dev.env").write_text(target.read_text())
    for name in made:
        monkeypatch.delenv(name, raising=False)
    env = run_stack.stack_env()
    assert env["AIBOT_WS_URL"] == f"ws://127.0.0.1:{run_stack.AIBOT_WS_PORT}"
    programs = {p.name: p for p in run_stack.programs(env)}
    assert programs["aibot-connection"].argv[1:] == ["-m", "app.web.aibot_connection"]
    assert programs["aibot-connection"].restart
    assert "--aibot-callback-url" in programs["emulator"].argv


def test_make_run_serves_the_demo_embedder_beside_the_model(monkeypatch):
    """The engine process serves models/demo-embed at /v1/embeddings; the knowledge base reaches
    it there with the demo model's thresholds (KB_MIN_SIMILARITY, KB_MIN_SCORE) over those its
    training chose; a server the operator configured wins."""
    from demo.grounded import DEMO_MIN_SCORE, DEMO_MIN_SIMILARITY
    from scripts import run_stack

    for name in ("EMBEDDINGS_BASE_URL", "EMBEDDINGS_MODEL", "EMBEDDINGS_API_KEY", "KB_MIN_SIMILARITY",
                 "KB_MIN_SCORE", "INFERENCE_BACKEND", "MODEL_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "engine-key-" + "k" * 20)
    env = run_stack.stack_env()
    assert env["EMBEDDINGS_API_KEY"] == env["OPENAI_API_KEY"]  # one server, one key
    assert env["EMBEDDINGS_BASE_URL"] == env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{run_stack.ENGINE_PORT}/v1"
    assert env["EMBEDDINGS_MODEL"] == "demo-embed"
    assert float(env["KB_MIN_SIMILARITY"]) == DEMO_MIN_SIMILARITY
    assert float(env["KB_MIN_SCORE"]) == DEMO_MIN_SCORE  # the demo model's reading, over the embedder's own
    engine = {p.name: p for p in run_stack.programs(env)}["engine"].argv
    assert engine[engine.index("--embeddings") + 1] == str(run_stack.ROOT / "models" / "demo-embed")

    monkeypatch.setenv("EMBEDDINGS_BASE_URL", "http://embeddings.internal/v1")
    env = run_stack.stack_env()
    assert env["EMBEDDINGS_BASE_URL"] == "http://embeddings.internal/v1"
    assert "--embeddings" not in {p.name: p for p in run_stack.programs(env)}["engine"].argv
    assert "KB_MIN_SIMILARITY" not in env  # the operator's embedder: the setting's default, not the demo's


def test_an_older_dev_envs_wecom_secrets_become_the_emulators_demo_values(tmp_path, capsys):
    """The emulator refuses any other; the app's own keys (which seal the local rows) stay."""
    import secrets

    from emulator.config import DEMO_SECRETS

    target = tmp_path / "dev.env"
    main(str(target))
    made = dict(line.split("=", 1) for line in target.read_text().splitlines())
    for name, (_, demo) in DEMO_SECRETS.items():
        assert made[name] == demo, name
    older = {**made, "WECOM_TOKEN": secrets.token_urlsafe(24), "AIBOT_SECRET": secrets.token_urlsafe(32)}
    target.write_text("".join(f"{k}={v}\n" for k, v in older.items()))
    main(str(target))
    assert dict(line.split("=", 1) for line in target.read_text().splitlines()) == made
    assert "WECOM_TOKEN, AIBOT_SECRET" in capsys.readouterr().out


def test_make_run_copies_the_audit_head_out_and_serves_v1_apart(monkeypatch):
    """The head's copy outside the database is on (var/audit-head.json, stale after 30 min with
    checkpoints every 10), and /v1 has a gunicorn of its own beside the callbacks'."""
    from app.config import load_settings
    from scripts import run_stack
    from tests.support.env import make_env

    for name in ("AUDIT_HEAD_FILE", "AUDIT_CHECKPOINT_MINUTES", "AUDIT_STALE_MINUTES", "API_BIND"):
        monkeypatch.delenv(name, raising=False)
    env = run_stack.stack_env()
    assert env["AUDIT_HEAD_FILE"] == str(run_stack.ROOT / "var" / "audit-head.json")
    settings = load_settings(_env_file=None, **{k.lower(): v for k, v in {**make_env(), **{
        k: env[k] for k in ("AUDIT_HEAD_FILE", "AUDIT_CHECKPOINT_MINUTES", "AUDIT_STALE_MINUTES")}}.items()})
    assert (settings.audit_checkpoint_minutes, settings.audit_stale_minutes) == (10, 30)
    web = {p.name: p for p in run_stack.programs(env)}
    assert web["web"].env["WEB_ROLE"] == "web" and web["api"].env["WEB_ROLE"] == "api"
    assert web["api"].env["WEB_BIND"] == env["API_BIND"] == f"127.0.0.1:{run_stack.API_PORT}"
    assert web["api"].env["INTAKE_SERVER"] == "0" and web["web"].argv == web["api"].argv


def test_make_run_writes_the_settings_its_services_use_for_the_cli(tmp_path, monkeypatch):
    """``kb add`` run beside ``make run`` must reach the same embeddings server (a document added
    without it has no vectors): var/stack.env holds what the services run with, the shell's
    ``set -a; . var/stack.env`` and the settings' own reading both give it back, values with
    spaces and quotes intact, and only its owner can read it."""
    import stat
    import subprocess

    from scripts import run_stack
    from scripts.dev_env import dev_env

    monkeypatch.delenv("EMBEDDINGS_BASE_URL", raising=False)
    monkeypatch.delenv("KB_FALLBACK_CONTACT", raising=False)
    env = {**dev_env(), **run_stack.stack_env(),
           "KB_FALLBACK_CONTACT": "IT 服务台 (ext. 8100), it's \"quoted\" $HOME"}
    path = tmp_path / "stack.env"
    run_stack.write_stack_env(env, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    shown = subprocess.run(["bash", "-c", f"set -a; . {path}; set +a; env -0"],
                           capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    sourced = dict(item.split("=", 1) for item in shown.stdout.split("\0") if "=" in item)
    for name in ("EMBEDDINGS_BASE_URL", "KB_MIN_SIMILARITY", "KB_FALLBACK_CONTACT", "WECOM_AES_KEY"):
        assert sourced[name] == env[name]
    settings = settings_from({k: v for k, v in sourced.items() if k in env})
    assert settings.embeddings_base_url == env["EMBEDDINGS_BASE_URL"]
    assert settings.kb_fallback_contact == env["KB_FALLBACK_CONTACT"]
