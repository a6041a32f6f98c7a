"""The rule extractor of end users' facts."""

from __future__ import annotations

from llmmesh.region.knowledge.memory import MAX_FACTS_PER_TURN, extract_facts


def test_first_person_statements_become_facts_about_the_user() -> None:
    said = [
        "Hi, my name is Greta Holm and I live in Bremen. I LOVE dark chocolate, and I work as a nurse.",
        "Remember that my dog is called Fido. I'm allergic to peanuts",
    ]
    assert extract_facts(said) == [
        "The user's name is Greta Holm.",
        "The user lives in Bremen.",
        "The user works as a nurse.",
        "The user loves dark chocolate.",
        "The user is allergic to peanuts.",
        "The user asked to remember: my dog is called Fido.",
    ]


def test_questions_and_other_people_teach_nothing() -> None:
    assert extract_facts(["What is the capital of France?", "She lives in Paris."]) == []


def test_a_turn_adds_a_bounded_number_of_facts() -> None:
    said = [" ".join(f"I like thing{n}." for n in range(40))]
    assert len(extract_facts(said)) == MAX_FACTS_PER_TURN
