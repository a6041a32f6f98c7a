"""Incremental detokenization with stop sequences, as vLLM streams it.

Text that could still turn out to be the start of a stop sequence is held
back (at most the longest stop's length minus one characters), so a stop
sequence is never streamed; when one completes, the text is cut before it.
Byte-fallback tokens that hold part of a UTF-8 character give no text until
the character is complete, so a character split over tokens streams whole.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from llmmesh.engine.sim.tokenizer import SimTokenizer


class StopAwareDetokenizer:
    """Turns output tokens into streamable text for one generation.

    ``resumed_token_ids`` were streamed before (a continuation): their text
    is not streamed again, but a stop sequence may begin inside it, and a
    character they left incomplete is completed by the tokens after them.
    :attr:`resumed_text` is their text.
    """

    def __init__(
        self, tokenizer: SimTokenizer, stop: Sequence[str], resumed_token_ids: Sequence[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        resumed_text = "".join(self._decode(token_id) for token_id in resumed_token_ids)
        self.resumed_text = resumed_text
        self._resumed_tail = resumed_text[len(resumed_text) - self._holdback :] if self._holdback else ""
        self._text = ""
        self._streamed = 0
        self.matched_stop = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text now safe to stream. After a stop
        sequence matched (see :attr:`matched_stop`) the generation must end."""
        piece = self._decode(token_id)
        self._text += piece
        if self._stops:
            combined = self._resumed_tail + self._text
            window_start = max(0, len(combined) - len(piece) - self._holdback)
            window = combined[window_start:]
            offset = window_start - len(self._resumed_tail)
            found = [(window.find(stop), stop) for stop in self._stops]
            hits = [(index, stop) for index, stop in found if index >= 0]
            if hits:
                index, stop = min(hits)
                self.matched_stop = stop
                self._text = self._text[: max(0, offset + index)]
                self._decoder.reset()  # bytes after the stop are cut with it
                return self.flush()
        safe_end = len(self._text) - self._holdback
        if safe_end <= self._streamed:
            return ""
        delta = self._text[self._streamed : safe_end]
        self._streamed = safe_end
        return delta

    def _decode(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """All text not streamed yet; call when the generation ends."""
        self._text += self._decoder.decode(b"", final=True)
        delta = self._text[self._streamed :]
        self._streamed = len(self._text)
        return delta
