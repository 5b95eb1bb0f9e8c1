"""``Services`` builds each long-lived object once, and every user takes it from there."""

from __future__ import annotations

import threading

from app.services import Services
from app.web.api.gateway import Gateway
from tests.support.env import make_env, settings_from
from worker.runtime import build_processor


def fresh_services() -> Services:
    return Services(settings_from(make_env(ALERT_WECOM_USERS="ops1|ops2")))


def test_accounting_its_alert_sender_and_the_wecom_client_are_built_once_and_shared():
    services = fresh_services()
    accounting = services.accounting
    assert accounting.on_alerts is services.alert_sender
    assert services.alert_sender.wecom is services.wecom
    assert services.alert_sender.recipients == ["ops1", "ops2"]
    # The web tier's gateway and the worker's meter charge through the same ledger writer, and
    # the worker sends with the same WeCom client (one access-token cache).
    assert Gateway(services).accounting is accounting
    processor = build_processor(services)
    assert processor.wecom is services.wecom
    assert processor.meter.accounting is accounting


def test_threads_asking_together_get_one_accounting():
    """The first API requests arrive together: they must not start two ledger writers."""
    services = fresh_services()
    barrier = threading.Barrier(16)
    seen = []

    def ask():
        barrier.wait()
        seen.append(services.accounting)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 16 and len({id(a) for a in seen}) == 1


def test_the_knowledge_base_keeps_its_caches_on_its_own_object(services):
    """The term hashers, vector index and server breaker live on ``services.knowledge_caches``,
    shared by every store and retriever of the process; nothing parks on ``Services`` itself."""
    from app.knowledge.retrieval import Retriever
    from app.knowledge.store import KnowledgeStore

    store, first, second = KnowledgeStore(services), Retriever(services), Retriever(services)
    caches = services.knowledge_caches
    assert first.hashers is second.hashers is caches.term_hashers
    assert store.hasher is caches.term_hashers[0]
    assert first.vectors is second.vectors is caches.vector_index
    assert first.breaker is second.breaker is caches.breaker
    assert first.search("年假有几天", []).passages == []  # searching works on an empty base
    assert not [name for name in vars(services) if name.startswith("_kb")]
