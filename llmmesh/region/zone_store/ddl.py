"""CockroachDB DDL that keeps each zone's rows inside the zone.

One multi-region CockroachDB database can hold every zone's store. What
makes that residency and not merely placement (``REGIONAL BY ROW`` alone
only chooses where the leaseholder lives) is one **super region per zone**:
the replicas of a row homed in a super region's database region stay in that
super region's regions. Each zone table gets a stored ``crdb_region``
computed from the row's ``home_region``; a region the mapping does not know
computes NULL, which the ``NOT NULL`` column rejects, so no row can be homed
outside its zone by default.

The statements are plain strings for an operator or a migration to run, in
order, on one connection (``enable_super_regions`` is a session setting).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from llmmesh.core.ids import is_valid_name
from llmmesh.region.zone_store import schema

REGION_COLUMN = "crdb_region"
_DATABASE_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class ZoneRegion:
    """A mesh region, its zone, and the CockroachDB region that homes its rows
    (a node's ``--locality region=``)."""

    zone: str
    region: str
    database_region: str


def _cockroach(dialect: Dialect | None) -> Dialect:
    if dialect is not None:
        return dialect
    from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

    cockroach: Dialect = CockroachDBDialect_psycopg()
    return cockroach


def create_table_statements(dialect: Dialect | None = None) -> list[str]:
    """``CREATE TABLE`` and ``CREATE INDEX`` for the zone tables, compiled for CockroachDB by default."""
    dialect = _cockroach(dialect)
    statements: list[str] = []
    for table in schema.ZONE_TABLES:
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        statements.extend(str(CreateIndex(index).compile(dialect=dialect)).strip() for index in table.indexes)
    return statements


def zone_residency_statements(
    database: str,
    regions: Sequence[ZoneRegion],
    *,
    primary_region: str | None = None,
    dialect: Dialect | None = None,
) -> list[str]:
    """Make ``database`` multi-region with one super region per zone and every zone table ``REGIONAL BY ROW``.

    ``primary_region`` (a database region) defaults to the first one named.
    ValueError when a name is malformed, a mesh region is named twice, or a
    database region would belong to two zones (super regions are disjoint).
    """
    zones = _zones(regions)
    database_regions = [r for members in zones.values() for r in members]
    primary = primary_region or database_regions[0]
    if primary not in database_regions:
        raise ValueError(f"primary region {primary!r} is not one of {database_regions}")
    dialect = _cockroach(dialect)
    prep = dialect.identifier_preparer
    db = prep.quote(database)

    def name(region: str) -> str:
        return prep.quote_identifier(region)

    statements = [
        "SET enable_super_regions = 'on'",
        f"ALTER DATABASE {db} SET PRIMARY REGION {name(primary)}",
    ]
    statements += [
        f"ALTER DATABASE {db} ADD REGION IF NOT EXISTS {name(r)}" for r in database_regions if r != primary
    ]
    statements += [
        f"ALTER DATABASE {db} ADD SUPER REGION {name(zone)} VALUES {', '.join(map(name, members))}"
        for zone, members in zones.items()
    ]
    home = _home_region_case(regions, dialect)
    column = prep.quote(REGION_COLUMN)
    for table in schema.ZONE_TABLES:
        quoted = prep.format_table(table)
        statements.append(
            f"ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS {column} crdb_internal_region NOT NULL "
            f"AS ({home}) STORED"
        )
        statements.append(f"ALTER TABLE {quoted} SET LOCALITY REGIONAL BY ROW AS {column}")
    return statements


def _zones(regions: Sequence[ZoneRegion]) -> dict[str, list[str]]:
    """Database regions by zone, in the order first named; checks the names and the disjointness."""
    if not regions:
        raise ValueError("no regions given")
    zones: dict[str, list[str]] = {}
    zone_of: dict[str, str] = {}
    seen: set[str] = set()
    for r in regions:
        if not (
            is_valid_name(r.zone) and is_valid_name(r.region) and _DATABASE_REGION.match(r.database_region)
        ):
            raise ValueError(f"malformed name in {r}")
        if r.region in seen:
            raise ValueError(f"region {r.region!r} is named twice")
        seen.add(r.region)
        owner = zone_of.setdefault(r.database_region, r.zone)
        if owner != r.zone:
            raise ValueError(f"database region {r.database_region!r} is in zones {owner!r} and {r.zone!r}")
        members = zones.setdefault(r.zone, [])
        if r.database_region not in members:
            members.append(r.database_region)
    return zones


def _home_region_case(regions: Sequence[ZoneRegion], dialect: Dialect) -> str:
    """``CASE home_region WHEN 'eu-west' THEN 'europe-west1' … END``.

    No ELSE: an unknown region computes NULL, which the column refuses.
    """

    def literal(text: str) -> str:
        return str(
            sa.literal(text, sa.String).compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        )

    home = dialect.identifier_preparer.quote("home_region")
    whens = " ".join(f"WHEN {literal(r.region)} THEN {literal(r.database_region)}" for r in regions)
    return f"CASE {home} {whens} END"
