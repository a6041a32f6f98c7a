"""The YAML writer: what it writes reads back as the same document."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.topology.yaml_text import to_yaml

yaml = pytest.importorskip("yaml")

scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
documents = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3)
        ),
        max_leaves=12,
    ),
    min_size=1,
    max_size=4,
)


@given(documents)
def test_written_yaml_reads_back_as_the_document(doc: dict[str, Any]) -> None:
    assert yaml.safe_load(to_yaml(doc)) == doc


def test_strings_yaml_would_read_as_other_types_are_quoted() -> None:
    text = to_yaml({"a": "true", "b": "0s", "c": "127.0.0.1", "d": "/healthz", "@type": "x", "e": []})
    assert text == 'a: "true"\nb: "0s"\nc: "127.0.0.1"\nd: /healthz\n"@type": x\ne: []\n'
    assert to_yaml({"line\n": ["a b", "-"]}) == '"line\\n":\n  - "a b"\n  - "-"\n'
