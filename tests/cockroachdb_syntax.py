"""What CockroachDB accepts of the SQL the mesh sends it (the stores'
migrations and locality from ``llmmesh db upgrade``, the region's
retrieval and memory), recorded from its documentation, with the release
that brought each; and :func:`problems`, which checks one statement
against the record for a target release, where no CockroachDB server runs.

The target is v25.4: the first release whose vector indexes take the
``vector_cosine_ops`` operator class, so ``ORDER BY embedding <=> $q`` is
served by the index (the v25.2 and v25.3 pages list "only L2 distance
(``<->``) searches are accelerated" among their known limitations).

Sources, all ``https://www.cockroachlabs.com/docs/<release>/<page>``:

- ``v24.2/vector``: the ``VECTOR`` type, ``VECTOR(n)``, its operators
  ``<->``, ``<#>`` and ``<=>`` (cosine distance), pgvector-compatible.
- ``v25.2/vector-indexes``: ``CREATE VECTOR INDEX`` and ``VECTOR INDEX``
  in ``CREATE TABLE``, prefix columns (used only when each is constrained
  to one value), ``feature.vector_index.enabled``; default opclass
  ``vector_l2_ops``.
- ``v25.4/vector-indexes``: opclasses ``vector_l2_ops``,
  ``vector_cosine_ops`` and ``vector_ip_ops``; ``<=>`` accelerated under
  ``vector_cosine_ops``.
- ``v23.1/full-text-search`` (and ``v24.1``, unchanged): ``TSVECTOR``,
  ``to_tsvector``, ``to_tsquery``, ``ts_rank``, ``@@``, a ``TSVECTOR``
  stored computed column (``AS (…) STORED``) under an inverted index; its
  "Unsupported features" list (``ts_rank_cd``, ``websearch_to_tsquery``,
  ``tsquery_phrase``, ``setweight``, inverted joins on ``TSVECTOR``, and
  the ``||``, ``&&``, ``<->``, ``!!``, ``@>``, ``<@`` tsquery operators).
- ``v21.1/inverted-indexes``: multi-column inverted indexes (prefix
  columns before the inverted one), ``INVERTED INDEX`` in ``CREATE TABLE``.
- ``create-table`` and ``create-index``: ``IF NOT EXISTS``, ``INDEX``
  declared in ``CREATE TABLE``, ``UNIQUE`` constraints; ``insert``:
  ``ON CONFLICT DO NOTHING``, ``RETURNING``; ``serial``: ``BIGSERIAL``
  (an ``INT8`` defaulting to ``unique_rowid()``); ``bytes``: ``BYTEA``
  is an alias of ``BYTES``; ``computed-columns``; ``limit-offset``;
  ``functions-and-operators``: ``count``, ``sum``, ``coalesce``.
- ``v21.1/multiregion-overview`` and ``alter-table``: ``SET LOCALITY
  REGIONAL BY ROW AS`` and ``GLOBAL``, ``crdb_internal_region`` columns.
- ``v21.1/alter-database``: ``SET PRIMARY REGION``, ``ADD REGION IF NOT
  EXISTS``; ``v22.1/alter-database`` and ``set-vars``: ``ADD`` and
  ``ALTER SUPER REGION … VALUES``, behind the session setting
  ``enable_super_regions``.
- ``create-table``: ``FOREIGN KEY (…) REFERENCES``, ``CONSTRAINT … PRIMARY
  KEY``, column ``DEFAULT``; ``decimal``: ``NUMERIC``; ``bool``:
  ``BOOLEAN``; ``jsonb``: ``JSON`` is an alias of ``JSONB``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Release = tuple[int, int]

TARGET: Release = (25, 4)


@dataclass(frozen=True)
class Feature:
    """A piece of syntax, where it is documented, and the release that brought it."""

    name: str
    since: Release
    source: str


_ALWAYS: Release = (2, 0)

STATEMENTS: dict[str, tuple[str, Feature]] = {
    "select": (r"SELECT .+ FROM .+", Feature("SELECT", _ALWAYS, "selection-queries")),
    "insert": (
        r"INSERT INTO \w+ \([^()]*\) VALUES \(.*\)(?: ON CONFLICT DO NOTHING)?(?: RETURNING [\w., ]+)?",
        Feature("INSERT … ON CONFLICT DO NOTHING … RETURNING", _ALWAYS, "insert"),
    ),
    "update": (r"UPDATE \w+ SET .+ WHERE .+", Feature("UPDATE", _ALWAYS, "update")),
    "delete": (r"DELETE FROM \w+ WHERE .+", Feature("DELETE", _ALWAYS, "delete")),
    "create table": (
        r"CREATE TABLE (?:IF NOT EXISTS )?\w+ \(.*\)",
        Feature("CREATE TABLE IF NOT EXISTS", _ALWAYS, "create-table"),
    ),
    "create index": (
        r"CREATE (?:UNIQUE )?INDEX (?:IF NOT EXISTS )?\w+ ON \w+ \([\w, ]+\)",
        Feature("CREATE INDEX", _ALWAYS, "create-index"),
    ),
    "add computed column": (
        r"ALTER TABLE \w+ ADD COLUMN IF NOT EXISTS \w+ crdb_internal_region NOT NULL AS \(.*\) STORED",
        Feature("crdb_internal_region computed column", (21, 1), "v21.1/multiregion-overview"),
    ),
    "set locality": (
        r"ALTER TABLE \w+ SET LOCALITY REGIONAL BY ROW AS \w+",
        Feature("SET LOCALITY REGIONAL BY ROW AS", (21, 1), "v21.1/alter-table"),
    ),
    "add column": (
        r"ALTER TABLE \w+ ADD COLUMN \w+ [A-Z]+(?:\(\d+\))?(?: WITH TIME ZONE)?(?: DEFAULT '[^']*')?"
        r"(?: NOT NULL)?",
        Feature("ALTER TABLE … ADD COLUMN … DEFAULT … NOT NULL", _ALWAYS, "alter-table"),
    ),
    "set locality global": (
        r"ALTER TABLE \w+ SET LOCALITY GLOBAL",
        Feature("SET LOCALITY GLOBAL", (21, 1), "v21.1/alter-table"),
    ),
    "set primary region": (
        r'ALTER DATABASE \w+ SET PRIMARY REGION "[\w.-]+"',
        Feature("SET PRIMARY REGION", (21, 1), "v21.1/alter-database"),
    ),
    "add region": (
        r'ALTER DATABASE \w+ ADD REGION IF NOT EXISTS "[\w.-]+"',
        Feature("ADD REGION IF NOT EXISTS", (21, 1), "v21.1/alter-database"),
    ),
    "super region": (
        r'ALTER DATABASE \w+ (?:ADD|ALTER) SUPER REGION "\w+" VALUES "[\w.-]+"(?:, "[\w.-]+")*',
        Feature("ADD/ALTER SUPER REGION", (22, 1), "v22.1/alter-database"),
    ),
    "super region setting": (
        r"SET enable_super_regions = 'on'",
        Feature("enable_super_regions", (22, 1), "v22.1/set-vars"),
    ),
}
"""The forms a whole statement may take (whitespace folded)."""

FUNCTIONS: dict[str, Feature] = {
    "to_tsvector": Feature("to_tsvector(config, text)", (23, 1), "v23.1/full-text-search"),
    "to_tsquery": Feature("to_tsquery(config, text)", (23, 1), "v23.1/full-text-search"),
    "ts_rank": Feature("ts_rank(tsvector, tsquery)", (23, 1), "v23.1/full-text-search"),
    "count": Feature("count", _ALWAYS, "functions-and-operators"),
    "sum": Feature("sum", _ALWAYS, "functions-and-operators"),
    "coalesce": Feature("coalesce", _ALWAYS, "functions-and-operators"),
}

OPERATORS: dict[str, Feature] = {
    "<=>": Feature("<=> (cosine distance)", (24, 2), "v24.2/vector"),
    "<->": Feature("<-> (L2 distance)", (24, 2), "v24.2/vector"),
    "@@": Feature("@@ (tsvector matches tsquery)", (23, 1), "v23.1/full-text-search"),
}
_OPERATOR = re.compile(r"<=>|<->|<#>|@@|@>|<@|&&|\|\||!!")

TYPES: dict[str, Feature] = {
    r"VARCHAR(?:\(\d+\))?": Feature("VARCHAR(n)", _ALWAYS, "string"),
    r"TEXT": Feature("TEXT", _ALWAYS, "string"),
    r"BIGINT": Feature("BIGINT", _ALWAYS, "int"),
    r"BOOLEAN": Feature("BOOLEAN", _ALWAYS, "bool"),
    r"NUMERIC": Feature("NUMERIC", _ALWAYS, "decimal"),
    r"JSONB?": Feature("JSON (JSONB)", _ALWAYS, "jsonb"),
    r"INTEGER": Feature("INTEGER", _ALWAYS, "int"),
    r"BIGSERIAL": Feature("BIGSERIAL", _ALWAYS, "serial"),
    r"BYTEA": Feature("BYTEA (BYTES)", _ALWAYS, "bytes"),
    r"TIMESTAMP WITH TIME ZONE": Feature("TIMESTAMPTZ", _ALWAYS, "timestamp"),
    r"TSVECTOR": Feature("TSVECTOR", (23, 1), "v23.1/tsvector"),
    r"VECTOR(?:\(\d+\))?": Feature("VECTOR(n)", (24, 2), "v24.2/vector"),
    r"crdb_internal_region": Feature("crdb_internal_region", (21, 1), "v21.1/multiregion-overview"),
}

CLAUSES: dict[str, Feature] = {
    r"\bAS \(.*\) STORED": Feature("stored computed column", _ALWAYS, "computed-columns"),
    r"\bOFFSET\b": Feature("OFFSET", _ALWAYS, "limit-offset"),
    r"\bLIMIT\b": Feature("LIMIT", _ALWAYS, "limit-offset"),
    r"\bJOIN\b": Feature("JOIN", _ALWAYS, "joins"),
    r"\bIN \(": Feature("IN (list)", _ALWAYS, "scalar-expressions"),
}
"""Syntax anywhere in a statement, found by its pattern."""

INDEXES: dict[str, Feature] = {
    "INDEX": Feature("INDEX in CREATE TABLE", _ALWAYS, "create-table"),
    "INVERTED INDEX": Feature("INVERTED INDEX (prefix columns, tsvector)", (23, 1), "v23.1/full-text-search"),
    "VECTOR INDEX": Feature("VECTOR INDEX (prefix columns, vector)", (25, 2), "v25.2/vector-indexes"),
}
"""Indexes a ``CREATE TABLE`` declares."""

OPCLASSES: dict[str, Feature] = {
    "vector_l2_ops": Feature("vector_l2_ops", (25, 2), "v25.2/vector-indexes"),
    "vector_cosine_ops": Feature("vector_cosine_ops", (25, 4), "v25.4/vector-indexes"),
    "vector_ip_ops": Feature("vector_ip_ops", (25, 4), "v25.4/vector-indexes"),
}

UNSUPPORTED: dict[str, str] = {
    r"\bts_rank_cd\(": "ts_rank_cd() (full-text-search, Unsupported features)",
    r"\bwebsearch_to_tsquery\(": "websearch_to_tsquery() (full-text-search, Unsupported features)",
    r"\btsquery_phrase\(": "tsquery_phrase() (full-text-search, Unsupported features)",
    r"\bsetweight\(": "setweight() (full-text-search, Unsupported features)",
    r"\bUSING (?:hnsw|ivfflat)\b": "pgvector's index methods: CockroachDB's is cspann (VECTOR INDEX)",
}

_NOT_CALLS = frozenset(
    {"IN", "VALUES", "AS", "KEY", "UNIQUE", "EXISTS", "INTO", "TABLE", "INDEX", "ON", "CAST", "AND", "OR"}
)
_CONSTRAINT = re.compile(r"^(?:PRIMARY KEY|FOREIGN KEY|CONSTRAINT \w+ (?:UNIQUE|PRIMARY KEY)|UNIQUE)\b")
_INLINE_INDEX = re.compile(r"^((?:INVERTED |VECTOR )?INDEX) \w+ \(([^()]*)\)$")
_CALL = re.compile(r"(?<![\w.])(\w+) ?\(")
_CAST = re.compile(r"::(TIMESTAMP WITH TIME ZONE|[A-Z]+(?:\(\d+\))?)|\bAS (VECTOR(?:\(\d+\))?)\)")


def fold(statement: str) -> str:
    """One line, single spaces, no space just inside parentheses."""
    text = " ".join(statement.split())
    return re.sub(r"\( ", "(", re.sub(r" \)", ")", text))


def problems(statement: str, target: Release = TARGET) -> list[str]:
    """Why CockroachDB ``target`` would not take ``statement``, by the
    record; empty when it would."""
    sql = fold(statement)
    found: list[str] = []

    def need(feature: Feature) -> None:
        found.extend(_too_new(feature, target))

    form = next((name for name, (rx, _) in STATEMENTS.items() if re.fullmatch(rx, sql)), None)
    if form is None:
        return [f"no recorded statement form: {sql[:160]}"]
    need(STATEMENTS[form][1])
    found += [f"unsupported: {why}" for rx, why in UNSUPPORTED.items() if re.search(rx, sql)]
    for rx, feature in CLAUSES.items():
        if re.search(rx, sql):
            need(feature)
    for operator in _OPERATOR.findall(sql):
        if operator in OPERATORS:
            need(OPERATORS[operator])
        else:
            found.append(f"operator not recorded: {operator}")
    for match in _CALL.finditer(sql):
        name = match.group(1)
        before = sql[: match.start()].split()[-1:] or [""]
        if name.upper() in _NOT_CALLS or before[0].upper() in (
            "INTO",
            "EXISTS",
            "TABLE",
            "INDEX",
            "ON",
            "REFERENCES",
        ):
            continue
        if any(re.fullmatch(rx, name) for rx in TYPES) or name.isdigit():
            continue
        if name.lower() in FUNCTIONS:
            need(FUNCTIONS[name.lower()])
        else:
            found.append(f"function not recorded: {name}")
    for cast in _CAST.finditer(sql):
        found += _type_problems(cast.group(1) or cast.group(2), target)
    if form == "create table":
        body = sql[sql.index("(") + 1 : sql.rindex(")")]
        for part in _top_level_parts(body):
            found += _definition_problems(part, target)
    return found


def _too_new(feature: Feature, target: Release) -> list[str]:
    if feature.since <= target:
        return []
    return [f"{feature.name} needs v{feature.since[0]}.{feature.since[1]} ({feature.source})"]


def _type_problems(kind: str, target: Release) -> list[str]:
    for rx, feature in TYPES.items():
        if re.fullmatch(rx, kind):
            return _too_new(feature, target)
    return [f"type not recorded: {kind}"]


def _definition_problems(part: str, target: Release) -> list[str]:
    if _CONSTRAINT.match(part):
        return []
    inline = _INLINE_INDEX.match(part)
    if inline:
        kind, columns = inline.groups()
        found = _too_new(INDEXES[kind], target)
        last = columns.split(",")[-1].split()
        if len(last) == 2:
            opclass = OPCLASSES.get(last[1])
            if opclass is None:
                return [*found, f"operator class not recorded: {last[1]}"]
            found += _too_new(opclass, target)
        return found
    _, _, rest = part.partition(" ")
    for rx, feature in TYPES.items():
        if re.match(rf"(?:{rx})(?: |$)", rest):
            return _too_new(feature, target)
    return [f"column type not recorded: {part}"]


def _top_level_parts(body: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    parts.append(body[start:].strip())
    return [p for p in parts if p]
