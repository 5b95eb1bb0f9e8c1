"""The worker process's one ``MessageProcessor``, built on first use and shared by every task
thread (with the threads pool concurrent chats share one engine).

Its own module so that whoever needs the running processor asks here: the tasks
(``worker.tasks``) build it, the scrape-time collectors (``worker.observability.metrics``) only
look at it (``current``), and neither imports the other: the Celery app, its signal handlers and
the tasks stay one-way.
"""

from __future__ import annotations

import threading

from app.config import get_settings
from app.llm import make_backend
from app.services import Services
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

_processor: MessageProcessor | None = None
_lock = threading.Lock()


def build_processor(services: Services) -> MessageProcessor:
    s = services.settings
    conversations = ConversationStore(services.redis, services.cipher, s.conversation_ttl_s,
                                      s.conversation_max_messages)
    return MessageProcessor(services, None, services.wecom, conversations,
                            llm_factory=make_backend)


def processor() -> MessageProcessor:
    """This process's processor, built from the environment's settings on first use."""
    global _processor
    if _processor is None:
        with _lock:
            if _processor is None:
                _processor = build_processor(Services(get_settings()))
    return _processor


def current() -> MessageProcessor | None:
    """The processor if one was built, without building it (a metrics scrape must not)."""
    return _processor
