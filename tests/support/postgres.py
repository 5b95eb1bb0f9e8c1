"""The shared PostgreSQL server the tests make their throwaway databases on, and what happens
when it is not there.

``DATA_TEST_PG`` names the server (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``).
The PostgreSQL variants of the tests skip only when ``TESTS_WITHOUT_POSTGRES=1`` says so, without
trying the server; otherwise a server that cannot be reached fails them, saying where it looked:
a budget race once showed only on PostgreSQL, so its variants never drop out of a run silently.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

SERVER = os.environ.get("DATA_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
# the same server's maintenance database, as a libpq URL (psycopg.connect), to create databases from
ADMIN = SERVER.rsplit("/", 1)[0].replace("postgresql+psycopg://", "postgresql://", 1) + "/postgres"
OPT_OUT = "TESTS_WITHOUT_POSTGRES"


def opted_out() -> bool:
    return os.environ.get(OPT_OUT) == "1"


def skip_if_opted_out() -> None:
    if opted_out():
        pytest.skip(f"PostgreSQL variant left out ({OPT_OUT}=1)")


def unreachable(exc: BaseException) -> NoReturn:
    pytest.fail(f"PostgreSQL not reachable at {SERVER.split('@')[-1]} (DATA_TEST_PG): {exc}\n"
                f"start it (make services) or set {OPT_OUT}=1 to leave the PostgreSQL variants out",
                pytrace=False)
