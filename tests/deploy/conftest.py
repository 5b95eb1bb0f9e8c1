"""The deployment files, loaded once: docker-compose.yml, the nginx config, the Dockerfiles."""

from __future__ import annotations

from pathlib import Path

import crossplane
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: ``!reset`` / ``!override`` (Compose's merge tags) kept as values."""


def _tagged(loader: ComposeLoader, tag: str, node: yaml.Node) -> dict:
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return {"tag": tag, "value": value}


ComposeLoader.add_multi_constructor("!", _tagged)


def load_compose(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=ComposeLoader)  # noqa: S506 - a SafeLoader subclass


@pytest.fixture(scope="session")
def compose() -> dict:
    return load_compose(ROOT / "docker-compose.yml")


@pytest.fixture(scope="session")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="session")
def nginx() -> list[dict]:
    parsed = crossplane.parse(str(ROOT / "docker" / "nginx" / "default.conf"), single=True,
                              check_ctx=False, comments=False)
    assert parsed["status"] == "ok", parsed["errors"]
    return parsed["config"][0]["parsed"]


@pytest.fixture(scope="session")
def gunicorn_conf() -> dict:
    """gunicorn.conf.py's settings, read with the environment it sees restored afterwards.

    The file sets PROMETHEUS_MULTIPROC_DIR for gunicorn; left behind, it would switch every later
    test's metrics into multiprocess mode.
    """
    import os
    import runpy
    import shutil

    saved = dict(os.environ)
    try:
        settings = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
        created = os.environ.get("PROMETHEUS_MULTIPROC_DIR") != saved.get("PROMETHEUS_MULTIPROC_DIR")
        if created:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return settings
