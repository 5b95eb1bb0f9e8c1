"""docker-compose.yml and the images promise what docs/deploy.md says: every service, a GPU for
the model server that the worker and /v1 call, health checks, migrations once before the app, a
PostgreSQL volume, no secrets."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.deploy.conftest import ROOT, load_compose

APP_SERVICES = ("web", "api", "worker", "beat")
SECRETS = ("WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY", "DATA_KEYS", "BLIND_INDEX_KEY",
           "SECRET_KEY", "OPENAI_API_KEY", "POSTGRES_PASSWORD")


def test_all_services_are_there(services):
    assert set(services) == {"web", "api", "worker", "beat", "redis", "postgres", "nginx", "migrate",
                             "aibot-connection", "engine"}


def test_every_long_running_service_has_a_health_check(services):
    for name, service in services.items():
        check = service.get("healthcheck", {})
        if name == "migrate":
            assert check == {"disable": True}, "the one-shot migrate has nothing to check"
            continue
        assert check.get("test"), f"{name} has no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL")
        assert not check.get("disable")


def test_health_checks_use_the_real_probes(services):
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    check = ["python", "-m", "worker.observability.heartbeat", "check"]
    assert services["worker"]["healthcheck"]["test"][1:] == [*check, "worker"]
    assert services["beat"]["healthcheck"]["test"][1:] == [*check, "beat"]
    assert "/nginx-healthz" in " ".join(services["nginx"]["healthcheck"]["test"])


def test_every_long_running_service_is_restarted_when_it_dies(services):
    # Docker restarts an exited container with a growing delay (100 ms, doubling); the worker
    # also survives a Redis restart in-process (worker/broker_fixes.py), this is the backstop.
    for name, service in services.items():
        expected = "no" if name == "migrate" else "unless-stopped"
        assert service.get("restart") == expected, name


def test_migrations_run_once_before_the_app(services):
    migrate = services["migrate"]
    assert migrate["command"] == ["python", "-m", "app.cli", "migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in APP_SERVICES:
        deps = services[name]["depends_on"]
        assert deps["migrate"] == {"condition": "service_completed_successfully"}, name
        assert deps["postgres"]["condition"] == "service_healthy"
        assert deps["redis"]["condition"] == "service_healthy"
    assert services["nginx"]["depends_on"]["web"]["condition"] == "service_healthy"


def test_the_engine_serves_the_model_on_an_nvidia_gpu(services):
    engine = services["engine"]
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("count", 0) != 0
               for d in devices)
    assert engine["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    command = engine["command"].split()
    assert command[:4] == ["python", "-m", "inference", "serve"]
    assert command[command.index("--port") + 1] == "8000" and command[command.index("--host") + 1] == "0.0.0.0"
    assert "/health" in " ".join(engine["healthcheck"]["test"])


def test_the_worker_and_web_call_the_model_server_and_load_no_model(services):
    for name in ("worker", "web"):
        env = services[name]["environment"]
        assert env["INFERENCE_BACKEND"] == "openai", name
        assert env["OPENAI_BASE_URL"] == "${OPENAI_BASE_URL:-http://engine:8000/v1}", name
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
        assert "deploy" not in services[name]  # no GPU
    served = services["engine"]["command"].split()
    assert served[served.index("--served-model-name") + 1] == "${OPENAI_MODEL:-glm}" == \
        services["worker"]["environment"]["OPENAI_MODEL"]
    command = services["worker"]["command"].split()
    assert command[:4] == ["celery", "-A", "worker.celery_app", "worker"]
    assert command[command.index("--pool") + 1] == "threads"
    assert command[command.index("-Q") + 1] == "chat"


def test_web_runs_gunicorn_with_its_config_behind_one_proxy(services, gunicorn_conf):
    web = services["web"]
    assert web["command"] == ["gunicorn", "-c", "gunicorn.conf.py", "app.web.factory:create_app()"]
    assert web["environment"]["TRUSTED_PROXIES"] == "1"
    assert web["environment"]["WEB_BIND"] == "0.0.0.0:8080"
    assert web["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    graceful = gunicorn_conf["graceful_timeout"]
    assert int(web["stop_grace_period"].removesuffix("s")) > graceful


def test_beat_runs_once_and_uses_the_same_app(services):
    command = services["beat"]["command"]
    assert command[:4] == ["celery", "-A", "worker.celery_app", "beat"]
    assert "deploy" not in services["beat"]  # no replicas


def test_postgres_keeps_its_data_in_a_named_volume(compose, services):
    mounts = services["postgres"]["volumes"]
    assert "pgdata:/var/lib/postgresql/data" in mounts
    assert "pgdata" in compose["volumes"]


def test_the_audit_heads_copy_is_on_in_a_volume_of_its_own(compose, services):
    """AUDIT_HEAD_FILE by default, in every service that appends to the chain, on a volume the
    database's containers never mount; the images make its folder the app user's."""
    for name in ("migrate", "aibot-connection", *APP_SERVICES):
        service = services[name]
        assert service["environment"]["AUDIT_HEAD_FILE"] == \
            "${AUDIT_HEAD_FILE:-/var/lib/wecom-bot/audit/head.json}", name
        assert "audit-head:/var/lib/wecom-bot/audit" in service["volumes"], name
    assert "audit-head" in compose["volumes"]
    assert not any("audit-head" in str(v) for v in services["postgres"].get("volumes", []))
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
        assert "-o bot -g bot -m 0700 /var/lib/wecom-bot/audit" in (ROOT / "docker" / dockerfile).read_text()


def test_app_services_read_secrets_from_env_file_and_none_are_written_here(services):
    for name in ("migrate", *APP_SERVICES):
        assert services[name]["env_file"] == ".env"
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if key in SECRETS:
                assert re.fullmatch(rf"\$\{{{key}(:[?-][^}}]*)?\}}", str(value)), f"{name}: {key} literal"
            if key == "DATABASE_URL":
                assert ":${POSTGRES_PASSWORD" in value and "@postgres:5432/" in value


def test_only_nginx_publishes_ports(services):
    for name, service in services.items():
        assert ("ports" in service) == (name == "nginx"), name
    assert any(str(p).endswith(":443") for p in services["nginx"]["ports"])
    mounts = services["nginx"]["volumes"]
    assert "./docker/nginx/default.conf:/etc/nginx/conf.d/default.conf:ro" in mounts
    assert "./docker/nginx/certs:/etc/nginx/certs:ro" in mounts


def test_env_never_reaches_git_or_an_image():
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and "docker/nginx/certs/" in ignored
    assert "certs/" in (ROOT / "docker" / "nginx" / ".gitignore").read_text().split()


def test_every_interpolated_variable_is_documented():
    example = (ROOT / ".env.example").read_text()
    names = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", (ROOT / "docker-compose.yml").read_text()))
    assert names >= {"POSTGRES_PASSWORD", "WORKER_CONCURRENCY"}
    missing = [n for n in sorted(names) if not re.search(rf"^#? ?{n}=", example, re.M)]
    assert not missing, f"not in .env.example: {missing}"


def test_gunicorn_settings_are_documented():
    example = (ROOT / ".env.example").read_text()
    names = set(re.findall(r"environ\.get\(\"([A-Z_]+)\"", (ROOT / "gunicorn.conf.py").read_text()))
    assert {"WEB_WORKERS", "WEB_THREADS", "WEB_TIMEOUT"} <= names
    missing = [n for n in sorted(names) if not re.search(rf"^#? ?{n}=", example, re.M)]
    assert not missing, f"not in .env.example: {missing}"


def _torch_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if d.startswith("torch=="))


def test_images_pin_the_torch_of_pyproject():
    """The CPU image installs torch's CPU build from the lock (tests/deploy/test_lock.py); the
    CUDA image installs its CUDA build by version from PyTorch's index, then the rest of the lock."""
    cpu = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", cpu, re.M)
    assert "--require-hashes" in cpu and "requirements.lock" in cpu
    cuda = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    assert f"ARG TORCH_VERSION={_torch_pin()}\n" in cuda
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu\d+$", cuda, re.M)
    assert "--lock-without-torch" in cuda and "--require-hashes" in cuda
    for text in (cpu, cuda):
        assert "USER bot" in text


@pytest.mark.parametrize("name, arg, base", [
    ("Dockerfile.cpu", "BASE_IMAGE", r"python:3\.11-slim-bookworm"),
    ("Dockerfile.cuda", "CUDA_IMAGE", r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+"),
])
def test_image_bases_are_pinned_by_digest_and_replaceable(name, arg, base):
    text = (ROOT / "docker" / name).read_text()
    assert re.search(rf"^ARG {arg}={base}@sha256:[0-9a-f]{{64}}$", text, re.M)
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f == f"${{{arg}}}" for f in froms), froms


def test_public_images_are_pinned_by_digest_and_replaceable(services):
    for name, variable, tag in (("postgres", "POSTGRES_IMAGE", "postgres:17"),
                                ("redis", "REDIS_IMAGE", "redis:7-alpine"),
                                ("nginx", "NGINX_IMAGE", "nginx:1.27-alpine")):
        image = services[name]["image"]
        assert re.fullmatch(rf"\$\{{{variable}:-{re.escape(tag)}@sha256:[0-9a-f]{{64}}\}}", image), image
        assert (ROOT / "docker" / "local" / f"{name}.Dockerfile").is_file(), "a stand-in to build here"


def test_requirements_helper_leaves_torch_to_the_image():
    out = subprocess.run(["python3", str(ROOT / "docker" / "requirements.py"), str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, check=True).stdout.split()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert out == [d for d in deps if not d.startswith("torch==")]


def test_cpu_override_drops_the_gpu():
    engine = load_compose(ROOT / "docker" / "compose.cpu.yml")["services"]["engine"]
    assert engine["deploy"] == {"tag": "reset", "value": {}}
    assert engine["build"]["dockerfile"] == "docker/Dockerfile.cpu"


def _compose_plugin() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _compose_plugin(), reason="the docker compose plugin is not installed")
def test_docker_compose_accepts_the_files(tmp_path):
    for name in ("docker-compose.yml", "docker", ".env.example"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / ".env").write_text((ROOT / ".env.example").read_text() + "\nPOSTGRES_PASSWORD=x\n")
    for files in (["docker-compose.yml"], ["docker-compose.yml", "docker/compose.cpu.yml"]):
        argv = ["docker", "compose", *[a for f in files for a in ("-f", f)], "config", "-q"]
        result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_images_carry_only_the_demo_model():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ignored.index("models/*") < ignored.index("!models/demo")


def test_aibot_connection_runs_two_replicas_under_both_composes(services):
    # podman-compose counts deploy.replicas only with mode: replicated said (Docker's default)
    assert services["aibot-connection"]["deploy"] == {"mode": "replicated", "replicas": 2}
