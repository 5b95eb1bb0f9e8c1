"""The deployment files, loaded once: docker-compose.yml, the nginx config, the Dockerfiles."""

from __future__ import annotations

from pathlib import Path

import crossplane
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


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
