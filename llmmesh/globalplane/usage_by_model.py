"""A tenant's usage in one month split by the model that served it.

Summed from the usage records (the monthly totals are per tenant only),
exactly, as billing priced each record at its own model's price when it
was ingested: the split adds up to the tenant's totals.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from llmmesh.globalplane import schema
from llmmesh.globalplane.usage_ledger import UsageTotals


def model_totals(conn: Connection, tenant_id: str, period: str, end_user: str = "") -> dict[str, UsageTotals]:
    """The tenant's totals of ``period`` by model name (those of ``end_user`` only, when given)."""
    r = schema.usage_records
    query = r.select().with_only_columns(
        r.c.model, r.c.input_tokens, r.c.output_tokens, r.c.cost_usd, r.c.continues_request_id
    )
    query = query.where(r.c.tenant_id == tenant_id, r.c.period == period)
    if end_user:
        query = query.where(r.c.end_user == end_user)
    totals: dict[str, UsageTotals] = {}
    for row in conn.execute(query):
        # A continued turn's record adds tokens, not a request.
        requests = 0 if row.continues_request_id else 1
        turn = UsageTotals(period, row.input_tokens, row.output_tokens, row.cost_usd, requests)
        totals[row.model] = totals.get(row.model, UsageTotals(period)).plus(turn)
    return dict(sorted(totals.items()))
