"""InputFilter and StreamingOutputFilter: blocking, windows, failing closed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.core.errors import PermissionDenied, Reason, Unavailable
from llmmesh.region.safety import (
    InputFilter,
    LlmJudgeBackend,
    OutputDecision,
    RulesBackend,
    SafetyBackend,
    SafetySettings,
    StreamingOutputFilter,
    Verdict,
    build_filters,
)
from llmmesh.region.safety.verdict import CheckKind
from llmmesh.region.turn.filtered_output import FilteredOutput
from tests.region.safety_texts import matches, rules, texts

PHRASE = "forbidden phrase"
# Words that hold the deny term "ass" inside them: never a match.
WORDS = ["assassin", "classic", "embarrass", "bass", "passage", "mass", "the", "a", "é", "日本語", "x_y"]
SEPARATORS = [" ", "  ", "\n", ", ", ". ", "-", "'", "\t"]


class RaisingBackend(SafetyBackend):
    name = "broken"

    async def check(self, text: str, *, kind: CheckKind) -> Verdict:
        raise ConnectionError("safety service down")


class HangingBackend(SafetyBackend):
    name = "slow"

    async def check(self, text: str, *, kind: CheckKind) -> Verdict:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class RecordingBackend(SafetyBackend):
    name = "recording"

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def check(self, text: str, *, kind: CheckKind) -> Verdict:
        self.texts.append(text)
        return Verdict.safe(self.name)


class RecordingRules(RulesBackend):
    """The rules, with the deny term "forbidden phrase", recording each text checked."""

    def __init__(self) -> None:
        super().__init__(deny_terms={"violence": ["forbidden phrase"]}, builtin=False)
        self.texts: list[str] = []

    def check_at_once(self, text: str, *, kind: CheckKind) -> Verdict | None:
        self.texts.append(text)
        return super().check_at_once(text, kind=kind)


def rules_with_phrase() -> RulesBackend:
    return RulesBackend(deny_terms={"violence": [PHRASE, "ass"]}, builtin=False)


async def stream(output: StreamingOutputFilter, deltas: Sequence[str]) -> tuple[str, Verdict | None]:
    """Feed ``deltas``; what was released and the verdict that stopped it."""
    released = ""
    fed = ""
    for delta in deltas:
        decision = await output.feed(delta)
        released += decision.release
        fed += delta
        if decision.stopped is not None:
            return released, decision.stopped
        assert released + output.held == fed
    decision = await output.finish()
    return released + decision.release, decision.stopped


def split_at(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


# ----------------------------------------------------------------- input


@pytest.mark.asyncio
async def test_input_filter_blocks_with_categories_and_backend() -> None:
    checker = InputFilter([RulesBackend()])
    with pytest.raises(PermissionDenied) as caught:
        await checker.check([("system", "Be kind."), ("user", "I want to kill myself")])
    error = caught.value
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert error.reason == Reason.CONTENT_FILTERED
    assert error.metadata == {"categories": "self-harm/intent", "backend": "rules"}
    assert "kill" not in error.message


@pytest.mark.asyncio
async def test_input_filter_catches_a_phrase_split_across_messages() -> None:
    with pytest.raises(PermissionDenied):
        await InputFilter([RulesBackend()]).check([("user", "I want to kill"), ("user", "myself")])


@pytest.mark.asyncio
async def test_input_filter_passes_clean_messages_and_skips_empty_ones() -> None:
    seen = RecordingBackend()
    checker = InputFilter([RulesBackend(), seen])
    await checker.check([("system", "You are helpful."), ("user", "What is a KV cache?")])
    assert seen.texts == ["You are helpful.\n\nWhat is a KV cache?"]
    await checker.check([("user", "")])
    assert len(seen.texts) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("broken", [RaisingBackend(), HangingBackend()])
async def test_input_filter_fails_closed(broken: SafetyBackend) -> None:
    checker = InputFilter([RulesBackend(), broken], timeout_s=0.01, retry_after_s=2.5)
    with pytest.raises(Unavailable) as caught:
        await checker.check([("user", "hello")])
    assert caught.value.reason == Reason.SAFETY_UNAVAILABLE
    assert caught.value.retry_after_s == 2.5
    assert caught.value.metadata == {"backend": broken.name}


@pytest.mark.asyncio
async def test_a_flag_wins_over_a_later_broken_backend() -> None:
    checker = InputFilter([RulesBackend(), RaisingBackend()])
    with pytest.raises(PermissionDenied):
        await checker.check([("user", "how to kill yourself")])


# ----------------------------------------------------------------- output


@pytest.mark.asyncio
async def test_phrase_split_across_deltas_is_caught_before_release() -> None:
    text = "word " * 80 + PHRASE + " and then " + "more " * 80
    at = text.index(PHRASE)
    deltas = [text[:at], "forb", "idden ", "phr", "ase", text[at + len(PHRASE) :]]
    output = StreamingOutputFilter([rules_with_phrase()], window_chars=64, overlap_chars=24)
    released, stopped = await stream(output, deltas)
    assert stopped is not None
    assert stopped.categories == ("violence",)
    assert text.startswith(released)
    assert len(released) <= at
    assert await output.feed("even more text") == OutputDecision("", stopped)
    assert await output.finish() == OutputDecision("", stopped)
    assert output.stopped is stopped


@pytest.mark.asyncio
async def test_clean_stream_is_released_as_soon_as_it_is_checked() -> None:
    output = StreamingOutputFilter([RulesBackend()], window_chars=32, overlap_chars=8)
    first = await output.feed("a" * 10 + " " + "b" * 30 + " ")
    assert first == OutputDecision("a" * 10 + " " + "b" * 30 + " ")
    assert output.held == ""
    assert await output.finish() == OutputDecision("")


@pytest.mark.asyncio
async def test_a_backend_that_cannot_tell_holds_back_the_overlap() -> None:
    output = StreamingOutputFilter([RulesBackend(), RecordingBackend()], window_chars=32, overlap_chars=8)
    first = await output.feed("a" * 10 + " " + "b" * 30 + " ")
    assert first.stopped is None
    assert first.release == ("a" * 10 + " " + "b" * 30 + " ")[:-8]
    assert output.held == "b" * 7 + " "
    last = await output.finish()
    assert last == OutputDecision("b" * 7 + " ")
    assert output.held == ""


@pytest.mark.asyncio
async def test_the_judge_cannot_tell_what_to_hold_back() -> None:
    judge = LlmJudgeBackend(_judge_never_called)
    assert judge.hold_from("some text ", kind="output") is None


@pytest.mark.asyncio
async def test_the_first_clean_delta_is_released_at_once() -> None:
    output = StreamingOutputFilter([RulesBackend()])
    assert await output.feed("Sure, here it is: ") == OutputDecision("Sure, here it is: ")
    # A word no rule can begin in goes out though it may go on ("Hellos").
    mid_word = StreamingOutputFilter([RulesBackend()])
    assert await mid_word.feed("Hello") == OutputDecision("Hello")
    assert await mid_word.feed(", world!") == OutputDecision(", world!")
    # One a deny-listed phrase can begin with waits for the next token.
    term_start = StreamingOutputFilter([RulesBackend()])
    assert await term_start.feed("I") == OutputDecision("")
    assert await term_start.feed(" agree.") == OutputDecision("I agree.")
    delivered = await FilteredOutput(StreamingOutputFilter([RulesBackend()])).feed("Yes! ", (7, 8))
    assert (delivered.text, delivered.token_ids) == ("Yes! ", (7, 8))


@pytest.mark.asyncio
async def test_a_first_token_no_rule_can_begin_in_goes_out_in_its_own_step() -> None:
    # Personal data reported only: no rule can begin in "2024" (no term starts
    # with a digit, no card or phone is checked), though its word may go on.
    def rules_no_pii() -> RulesBackend:
        return RulesBackend(deny_terms={"violence": [PHRASE]}, builtin=False, report_only=["pii"])

    assert await StreamingOutputFilter([rules_no_pii()]).feed("2024") == OutputDecision("2024")
    delivered = await FilteredOutput(StreamingOutputFilter([rules_no_pii()])).feed("2024", (9,))
    assert (delivered.text, delivered.token_ids) == ("2024", (9,))
    # Held from where a rule could still begin: a prefix of the phrase ...
    output = StreamingOutputFilter([rules_no_pii()])
    assert await output.feed("2024 forb") == OutputDecision("2024 ")
    assert await output.feed("idden") == OutputDecision("")
    assert (await output.feed(" phrase.")).stopped is not None
    # ... or digits that may yet grow into a card number, with personal data blocking.
    assert await StreamingOutputFilter([RulesBackend()]).feed("2024") == OutputDecision("")
    # A model judge cannot tell: nothing goes out past what it checked.
    judged = StreamingOutputFilter([rules_no_pii(), RecordingBackend()], 64, 16)
    assert await judged.feed("2024") == OutputDecision("")


@pytest.mark.asyncio
async def test_text_that_could_start_a_flagged_phrase_waits_for_what_follows() -> None:
    output = StreamingOutputFilter([rules_with_phrase()])
    assert await output.feed("it was a forbidden ") == OutputDecision("it was a ")
    assert await output.feed("fruit. ") == OutputDecision("forbidden fruit. ")


@pytest.mark.asyncio
async def test_a_phrase_fed_a_character_at_a_time_is_caught_with_none_of_it_released() -> None:
    head = "Here is the story: "
    text = head + "the " + PHRASE.replace(" ", " \n ") + ", and more."
    output = StreamingOutputFilter([rules_with_phrase()])
    released, stopped = await stream(output, list(text))
    assert stopped is not None
    assert released == head + "the "


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("deltas", "flagged"),
    [
        (["pay ", "3782", " 822463", " 10005", " now"], True),  # a Luhn-valid Amex number
        (["pay ", "3782", " 822463", " 10006", " now"], False),  # one digit off
    ],
)
async def test_card_digits_are_held_while_they_could_still_form_a_card(
    deltas: list[str], flagged: bool
) -> None:
    output = StreamingOutputFilter([RulesBackend()])
    released = ""
    for delta in deltas[:-1]:
        decision = await output.feed(delta)
        released += decision.release
        assert decision.stopped is None
        assert released == "pay "
    last = await output.feed(deltas[-1])
    assert (last.stopped is not None) == flagged
    assert released + last.release == ("pay " if flagged else "pay 3782 822463 10006 now")


@pytest.mark.asyncio
async def test_an_email_address_is_held_from_its_at_sign() -> None:
    # The word before the "@" is no address yet and goes out; the "@" and the
    # domain never do, and the address stops the reply once it is whole.
    released, stopped = await stream(
        StreamingOutputFilter([RulesBackend()]), ["write to ", "jane", "@", "example", ".com", " today"]
    )
    assert stopped is not None and stopped.categories == ("pii",)
    assert released == "write to jane"
    released, stopped = await stream(StreamingOutputFilter([RulesBackend()]), ["ask jane", "@", "home."])
    assert stopped is None
    assert released == "ask jane@home."


@pytest.mark.asyncio
async def test_an_address_whose_local_part_went_out_longer_than_the_overlap_still_stops_the_reply() -> None:
    # Narrow windows reach the overlap back before the "@": a longer local
    # part is out of the window, but its tail still reads as an address.
    local = "first.middle.last." * 6
    text = f"mail {local}jane@mail.example.org now"
    deltas = [text[i : i + 3] for i in range(0, len(text), 3)]
    seen = RecordingRules()
    released, stopped = await stream(StreamingOutputFilter([seen], 256, 16), deltas)
    assert stopped is not None and stopped.categories == ("pii",)
    assert "@" not in released and released.startswith("mail first.middle")
    assert len(seen.texts[-1]) < len(text) - len("mail ")


@pytest.mark.asyncio
async def test_no_part_of_a_term_goes_out_before_a_mark_to_come_completes_it() -> None:
    # "cafe" is no prefix of "café noir" until a combining acute follows the e.
    accented = RulesBackend(deny_terms={"violence": ["caf\u00e9 noir"]}, builtin=False)
    deltas = ["a caf", "e", "\u0301", " noir", " ok"]
    released, stopped = await stream(StreamingOutputFilter([accented]), deltas)
    assert stopped is not None
    assert released == "a "


@pytest.mark.asyncio
async def test_digits_that_can_no_longer_form_a_card_are_released() -> None:
    output = StreamingOutputFilter([RulesBackend()])
    # Twenty digits in one group: too long for a card, however the run goes on.
    assert await output.feed("ref 12345678901234567890 ") == OutputDecision("ref 12345678901234567890 ")
    assert await output.feed("then 4111 ") == OutputDecision("then ")
    assert await output.feed("apples") == OutputDecision("4111 apples")  # the run ended


@pytest.mark.asyncio
async def test_a_window_never_ends_inside_an_unfinished_word() -> None:
    output = StreamingOutputFilter([rules_with_phrase()], window_chars=32, overlap_chars=8)
    released, stopped = await stream(output, ["a long ", "ass", "assin", " story"])
    assert stopped is None
    assert released == "a long assassin story"
    released, stopped = await stream(
        StreamingOutputFilter([rules_with_phrase()], 32, 8), ["a long ", "ass", " story"]
    )
    assert stopped is not None
    assert released == "a long "


@pytest.mark.asyncio
async def test_judge_style_checks_run_only_on_full_windows() -> None:
    seen = RecordingBackend()
    output = StreamingOutputFilter([seen], window_chars=40, overlap_chars=10, min_check_chars=30)
    released = ""
    for _ in range(10):
        released += (await output.feed("abc ")).release
    assert seen.texts == ["abc " * 7]
    assert released == ("abc " * 7)[:-10]
    released += (await output.finish()).release
    assert seen.texts == ["abc " * 7, "abc " * 10]
    assert released == "abc " * 10


@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=120),
    separators=st.lists(st.sampled_from(SEPARATORS), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=40),
    window=st.integers(2, 96),
    data=st.data(),
)
def test_clean_text_is_released_exactly_in_order(
    words: list[str], separators: list[str], cuts: list[int], window: int, data: st.DataObject
) -> None:
    text = "".join(w + separators[i % len(separators)] for i, w in enumerate(words))
    overlap = data.draw(st.integers(0, window - 1))
    min_check = data.draw(st.integers(1, window - overlap))
    output = StreamingOutputFilter(
        [rules_with_phrase(), RulesBackend()], window, overlap, min_check_chars=min_check
    )
    released, stopped = asyncio.run(stream(output, split_at(text, cuts)))
    assert stopped is None
    assert released == text


@given(
    before=st.lists(st.sampled_from(WORDS), max_size=60),
    after=st.lists(st.sampled_from(WORDS), max_size=60),
    cuts=st.lists(st.integers(0, 10_000), max_size=40),
    extra=st.integers(1, 80),
    data=st.data(),
)
def test_a_phrase_within_the_overlap_is_always_caught_before_release(
    before: list[str], after: list[str], cuts: list[int], extra: int, data: st.DataObject
) -> None:
    head = " ".join(before) + " "
    text = head + PHRASE + " " + " ".join(after)
    overlap = data.draw(st.integers(len(PHRASE), len(PHRASE) + 40))
    window = overlap + extra
    min_check = data.draw(st.integers(1, window - overlap))
    output = StreamingOutputFilter([rules_with_phrase()], window, overlap, min_check_chars=min_check)
    released, stopped = asyncio.run(stream(output, split_at(text, cuts)))
    assert stopped is not None
    assert len(released) <= len(head)
    assert text.startswith(released)


@given(
    text=texts(max_pieces=30),
    cuts=st.lists(st.integers(0, 10_000), max_size=60),
    window=st.integers(64, 200),
    hold_first_word=st.booleans(),
    data=st.data(),
)
def test_no_part_of_a_match_is_released_however_the_deltas_split_it(
    text: str, cuts: list[int], window: int, hold_first_word: bool, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(40, window - 1))
    min_check = data.draw(st.integers(1, window - overlap))
    output = StreamingOutputFilter(
        [rules(hold_first_word=hold_first_word)], window, overlap, min_check_chars=min_check
    )
    released, stopped = asyncio.run(stream(output, split_at(text, cuts)))
    assert text.startswith(released)
    # The windows see whole any match of up to the overlap: it must stop the
    # reply, and none of it (past its first word, where that may go out) may have gone out before.
    found = matches(text, hold_first_word=hold_first_word)
    seen_whole = [match.guarded for match in found if match.end - match.start <= overlap]
    if seen_whole:
        assert stopped is not None
        assert len(released) <= min(seen_whole)
    elif stopped is None:
        assert released == text


class WholeWindows(StreamingOutputFilter):
    """Checks every window whole, as the filter did before it narrowed
    windows for backends that tell exactly what to hold back."""

    def _window_floor(self, stop: int) -> int:
        return min(stop - self._window, self._checked - self._overlap)


async def decisions(output: StreamingOutputFilter, deltas: Sequence[str]) -> list[tuple[str, bool]]:
    """Each delta's release and whether it stopped the reply, then the finish's."""
    made = []
    for delta in deltas:
        decision = await output.feed(delta)
        made.append((decision.release, decision.stopped is not None))
        if decision.stopped is not None:
            return made
    decision = await output.finish()
    return [*made, (decision.release, decision.stopped is not None)]


@given(
    text=texts(max_pieces=60),
    cuts=st.lists(st.integers(0, 10_000), max_size=60),
    window=st.integers(16, 256),
    builtin=st.booleans(),
    hold_first_word=st.booleans(),
    data=st.data(),
)
def test_narrow_windows_decide_as_whole_ones_for_backends_that_tell_exactly(
    text: str, cuts: list[int], window: int, builtin: bool, hold_first_word: bool, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(1, window - 1))
    backend = RulesBackend(
        deny_terms={"violence": ["forbidden phrase"]}, builtin=builtin, hold_first_word=hold_first_word
    )
    deltas = split_at(text, cuts)
    narrow = asyncio.run(decisions(StreamingOutputFilter([backend], window, overlap), deltas))
    whole = asyncio.run(decisions(WholeWindows([backend], window, overlap), deltas))
    assert narrow == whole


@pytest.mark.asyncio
async def test_a_check_reads_the_unreleased_text_and_the_overlap_before_it() -> None:
    seen = RecordingRules()
    output = StreamingOutputFilter([seen], 256, 16)
    for word in ("alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ", "theta ", "iota "):
        assert (await output.feed(word)).release == word
    assert seen.texts[-1] == " zeta eta theta iota "
    # A term's prefix is held, and the next window reaches the overlap back before it.
    assert (await output.feed("forbidden ")).release == ""
    assert (await output.feed("fruit ")).release == "forbidden fruit "
    assert seen.texts[-1] == " eta theta iota forbidden fruit "


@pytest.mark.asyncio
@pytest.mark.parametrize("broken", [RaisingBackend(), HangingBackend()])
async def test_output_filter_fails_closed_and_stays_failed(broken: SafetyBackend) -> None:
    output = StreamingOutputFilter([RulesBackend(), broken], 32, 8, timeout_s=0.01)
    with pytest.raises(Unavailable) as caught:
        await output.feed("hello there ")
    assert caught.value.reason == Reason.SAFETY_UNAVAILABLE
    assert caught.value.retry_after_s == 1.0
    with pytest.raises(Unavailable):
        await output.finish()


def test_output_filter_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="overlap"):
        StreamingOutputFilter([], window_chars=10, overlap_chars=10)
    with pytest.raises(ValueError, match="min_check"):
        StreamingOutputFilter([], 10, 4, min_check_chars=7)


@pytest.mark.asyncio
async def test_feed_after_finish_is_an_error() -> None:
    output = StreamingOutputFilter([], 10, 4)
    assert await output.finish() == OutputDecision("")
    with pytest.raises(RuntimeError):
        await output.feed("late")


# ----------------------------------------------------------------- factory


async def _judge_never_called(turns: list[tuple[str, str]], max_tokens: int) -> str:
    raise AssertionError("the judge was called")


def test_build_filters_chooses_backends_by_name() -> None:
    rules_only = build_filters(SafetySettings(safety_report_only="pii"))
    assert [b.name for b in rules_only.backends] == ["rules"]
    assert rules_only.min_check_chars == 1
    both = build_filters(SafetySettings(safety_backends="both"), judge=_judge_never_called)
    assert [b.name for b in both.backends] == ["rules", "judge"]
    assert both.min_check_chars == 256 - 64
    judge_only = build_filters(SafetySettings(safety_backends=" judge "), judge=_judge_never_called)
    assert [b.name for b in judge_only.backends] == ["judge"]
    assert build_filters(SafetySettings(safety_backends="none")).backends == ()
    assert both.new_output_filter() is not both.new_output_filter()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (SafetySettings(safety_backends="judge"), "needs a model"),
        (SafetySettings(safety_backends="rules,openai"), "unknown safety backend"),
        (SafetySettings(safety_report_only="nsfw"), "unknown safety category"),
        (SafetySettings(safety_deny_terms="gore=x"), "unknown safety category"),
        (SafetySettings(safety_window_chars=64, safety_overlap_chars=64), "overlap"),
    ],
)
def test_build_filters_rejects_bad_settings(values: SafetySettings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_filters(values)


@pytest.mark.asyncio
async def test_built_filters_use_configured_terms_and_report_only() -> None:
    filters = build_filters(SafetySettings(safety_deny_terms="violence=knee him", safety_report_only="pii"))
    await filters.input_filter.check([("user", "mail jane@example.com")])
    with pytest.raises(PermissionDenied):
        await filters.input_filter.check([("user", "knee him")])


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("hold_first_word", "expected"),
    [
        # The default: a phrase is held from its second word, so a reply's first word leaves with its token.
        (False, [(" You", False), ("", False), ("", False), ("", True)]),
        (True, [(" ", False), ("", False), ("", False), ("", True)]),
    ],
)
async def test_a_flagged_phrase_never_goes_out_past_its_first_word(
    hold_first_word: bool, expected: list[tuple[str, bool]]
) -> None:
    filters = build_filters(SafetySettings(safety_hold_first_word=hold_first_word))
    assert await decisions(filters.new_output_filter(), [" You", " are", " worthless", " now"]) == expected
    # Clean text after such a word goes out once the next word tells.
    made = await decisions(filters.new_output_filter(), [" You", " are", " right", "."])
    assert "".join(release for release, _ in made) == " You are right."
    assert made[0][0] == (" " if hold_first_word else " You")
    # A one-word term is held from its first letters either way.
    assert (await filters.new_output_filter().feed(" Disem")).release == " "
