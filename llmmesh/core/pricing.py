"""Turn costs in exact decimal arithmetic, one rule for every plane: the cost
a region streams to the client is the cost billing records."""

from __future__ import annotations

import decimal
from decimal import Decimal

# Wide enough that no token count times a price rounds.
EXACT = decimal.Context(prec=60)


def turn_cost(
    input_per_1k: Decimal, output_per_1k: Decimal, input_tokens: int, output_tokens: int
) -> Decimal:
    """Exact USD cost: tokens x price per 1,000, input and output priced apart."""
    input_cost = EXACT.multiply(Decimal(input_tokens), input_per_1k).scaleb(-3, EXACT)
    output_cost = EXACT.multiply(Decimal(output_tokens), output_per_1k).scaleb(-3, EXACT)
    return EXACT.add(input_cost, output_cost)


def format_usd(amount: Decimal) -> str:
    """``amount`` as a plain decimal string without exponent or trailing zeros."""
    return format(EXACT.normalize(amount), "f") if amount else "0"
