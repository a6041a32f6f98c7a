"""CockroachDB's SQL dialect over the test PostgreSQL, where no CockroachDB
server runs: what the region's CockroachDB code sends, seen and run.

A scratch schema of the test database holds a ``version()`` that answers
with a CockroachDB banner, first on the ``search_path`` (before
``pg_catalog``), so ``sqlalchemy_cockroachdb`` takes the server for
CockroachDB :data:`BANNER_VERSION` and every statement goes out through
its dialect and psycopg's CockroachDB connection.

:func:`cockroach_url` alone stops there: a statement only CockroachDB
takes fails with PostgreSQL's own error. With ``emulate=True`` the schema
also holds what PostgreSQL needs to run CockroachDB's retrieval SQL, and
each statement is rewritten by :data:`REWRITES` just before it reaches the
driver: a ``VECTOR`` is a ``real[]`` read from its text by
``crdb_vector()``, ``<=>`` is an operator computing the cosine distance,
a stored computed column is spelled as PostgreSQL spells it, and the
indexes a ``CREATE TABLE`` declares inline are left out (PostgreSQL has no
such clause; an index changes no answer) as is an index hint
(``table@index``). Everything else (``@@``,
``to_tsquery``, ``ts_rank``, ``BIGSERIAL``, ``RETURNING``, ``ON
CONFLICT``) is run as written. Every statement is recorded as written,
before any rewrite, for the syntax checks of
``tests/cockroachdb_syntax.py``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import fresh_schema

BANNER_VERSION = "v25.4.0"
"""The release the scratch schema answers as, unless told another."""


def banner(release: str) -> str:
    """``SELECT version()`` as CockroachDB ``release`` answers it."""
    return f"CockroachDB CCL {release} (x86_64-pc-linux-gnu, built 2025/11/03 00:00:00, go1.23.12)"


REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bVECTOR\(\d+\)"), "real[]"),
    (re.compile(r"CAST\((%\(\w+\)s|'[^']*') AS VECTOR\)"), r"crdb_vector(\1)"),
    (re.compile(r" AS \((to_tsvector\(.*?\))\) STORED"), r" GENERATED ALWAYS AS (\1) STORED"),
    (re.compile(r",\s*(?:INVERTED |VECTOR )?INDEX \w+ \([^()]*\)"), ""),
    (re.compile(r"(?<=\w)@\w+"), ""),
)
"""CockroachDB's spelling, and PostgreSQL's for the same thing, in order."""

_EMULATION = """
CREATE FUNCTION {s}.crdb_vector(text) RETURNS real[] LANGUAGE sql IMMUTABLE STRICT
    AS $$ SELECT ('{{' || btrim($1, '[]') || '}}')::real[] $$;
CREATE FUNCTION {s}.crdb_cosine_distance(real[], real[]) RETURNS float8 LANGUAGE sql IMMUTABLE STRICT
    AS $$ SELECT 1 - sum(a * b) / (sqrt(sum(a * a)) * sqrt(sum(b * b))) FROM unnest($1, $2) AS t(a, b) $$;
CREATE OPERATOR {s}.<=> (LEFTARG = real[], RIGHTARG = real[], FUNCTION = {s}.crdb_cosine_distance);
"""


@dataclass
class Cockroach:
    """A scratch schema posing as a CockroachDB database, and what was sent to it."""

    url: str
    schema: str
    emulate: bool
    sent: list[str] = field(default_factory=list)

    def rewrite(self, statement: str) -> str:
        """``statement`` as PostgreSQL runs it (unchanged unless emulating)."""
        if self.emulate:
            for pattern, replacement in REWRITES:
                statement = pattern.sub(replacement, statement)
        return statement


@contextmanager
def cockroach_url(
    postgres_url: str, *, emulate: bool = False, release: str = BANNER_VERSION
) -> Iterator[Cockroach]:
    """A ``cockroachdb+psycopg://`` URL on a new schema of the test
    database (dropped afterwards) that answers as CockroachDB ``release``;
    every statement a CockroachDB engine sends while this is open is recorded."""
    schema = f"llmmesh_crdb_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        conn.exec_driver_sql(
            f'CREATE FUNCTION "{schema}".version() RETURNS text LANGUAGE sql IMMUTABLE '
            f"AS $$ SELECT '{banner(release)}'::text $$"
        )
        if emulate:
            conn.exec_driver_sql(_EMULATION.format(s=f'"{schema}"'))
    url = sa.make_url(postgres_url).set(
        drivername="cockroachdb+psycopg", query={"options": f"-csearch_path={schema},pg_catalog"}
    )
    cockroach = Cockroach(url.render_as_string(hide_password=False), schema, emulate)

    def before_execute(
        conn: sa.Connection, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> tuple[str, Any]:
        if conn.dialect.name != "cockroachdb" or conn.engine.url.query.get("options") != url.query["options"]:
            return statement, parameters
        cockroach.sent.append(statement)
        return cockroach.rewrite(statement), parameters

    sa.event.listen(sa.Engine, "before_cursor_execute", before_execute, retval=True)
    try:
        yield cockroach
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", before_execute)
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


RETRIEVAL_ENGINES = [
    "file",
    pytest.param("postgresql", marks=pytest.mark.services),
    pytest.param("cockroachdb", marks=pytest.mark.services),
]
"""The zone store kinds retrieval runs on: an SQLite file, PostgreSQL, and
CockroachDB's SQL emulated on PostgreSQL."""


@contextmanager
def retrieval_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The zone store URL of the engine ``request.param`` names (one of :data:`RETRIEVAL_ENGINES`)."""
    if request.param == "file":
        yield f"sqlite:///{tmp_path / 'us.db'}"
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    if request.param == "postgresql":
        with fresh_schema(postgres_url) as url:
            yield url
        return
    with cockroach_url(postgres_url, emulate=True) as cockroach:
        yield cockroach.url
