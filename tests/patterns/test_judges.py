"""The two margin judges, as units (WiM runs with each are in test_wim.py)."""

from __future__ import annotations

import math

import pytest

from marginalia.errors import UserError
from marginalia.models.fake import ScriptedGenerator
from marginalia.patterns.grounding import (
    SentenceSplitter,
    list_items,
    question_clauses,
    question_names,
    sentence_spans,
    units,
)
from marginalia.patterns.judges import (
    CLAUSE_SHARE,
    LINK_SENTENCES,
    GroundedJudge,
    SeparateJudge,
    Verdict,
    content_words,
    find_evidence,
    is_empty_margin,
    make_judge,
)
from marginalia.records import Segment

QUESTION = "Which pier does the night ferry to Brackwater leave from?"
FACT = "The night ferry to Brackwater leaves from pier 47."
READ = ("The bakery near the Carrow bridge was known for its bright rye bread. "
        f"{FACT} Traders at the Lindholm market sold wool and honey from early morning.\n")
SEGMENT = Segment(0, 0, len(READ), READ, ())


@pytest.mark.parametrize("text", ["", "  ", "NONE", "None.", "no", "Nothing", "n/a", "- none -"])
def test_empty_margins(text: str) -> None:
    assert is_empty_margin(text)


@pytest.mark.parametrize("text", ["Pier 47.", "No ferry leaves at night.", "Nonetheless, pier 47."])
def test_nonempty_margins(text: str) -> None:
    assert not is_empty_margin(text)


def test_content_words_drop_stopwords_and_inflections() -> None:
    words = content_words("Which pier does THE ferry leave from?")
    assert len(words) == 3
    assert words == content_words("pier ferry leaves")
    assert content_words("leaves") == content_words("leave")
    assert content_words("named") == content_words("name")
    assert content_words("universities studied") == content_words("university study")
    assert content_words("ties lied") == ["tie", "lied"]  # too short to be a plural of "-y"
    assert content_words("4719 47") == ["4719", "47"]


def test_grounded_accepts_a_quote_and_cites_its_sentence() -> None:
    verdict = GroundedJudge().judge(QUESTION, FACT, SEGMENT, READ)
    assert verdict.relevant and verdict.score == 1.0
    assert verdict.evidence is not None
    assert READ[slice(*verdict.evidence)].strip() == FACT


@pytest.mark.parametrize(
    "margin, reason",
    [
        ("NONE", "nothing was found"),
        # copied, but far from the question
        ("The bakery near the Carrow bridge was known for its bright rye bread.", "0% of the question's words"),
        ("Pier 99.", "none of the words it adds"),     # its only new word was never read
        ("The night ferry to Brackwater.", "adds nothing"),  # nothing beyond the question
        ("The ferry pier is near the Carrow bakery.", "0% of the question's words"),
    ],
)
def test_grounded_rejects(margin: str, reason: str) -> None:
    verdict = GroundedJudge().judge(QUESTION, margin, SEGMENT, READ)
    assert not verdict.relevant
    assert reason in verdict.reason


def test_grounded_threshold() -> None:
    margin = f"{FACT[:-1]} with lanterns."  # new words: 47 (read) and lanterns (not): 50%
    assert GroundedJudge(0.5).judge(QUESTION, margin, SEGMENT, READ).relevant
    assert not GroundedJudge(0.75).judge(QUESTION, margin, SEGMENT, READ).relevant
    for bad in (-0.1, 1.5):
        with pytest.raises(UserError):
            GroundedJudge(bad)


def test_grounded_rejects_a_wrong_number_in_a_copied_sentence() -> None:
    """Found as a bug: {leaves, 99} once gave support 0.5 (leaves found) and passed."""
    for margin in ("The night ferry to Brackwater leaves from pier 99.",
                   "The night ferry to Brackwater leaves from pier 47 at 9 pm."):
        verdict = GroundedJudge().judge(QUESTION, margin, SEGMENT, READ)
        assert not verdict.relevant, margin


def test_a_margin_is_kept_as_the_sentences_that_pass_on_their_own() -> None:
    """Found in NIAH at 64k with SmolLM2: "The answer is: 1.  The harbour master ... logged exactly 4438131
    crates ..." was dropped whole for its invented first sentence, though the second was copied."""
    verdict = GroundedJudge().judge(QUESTION, f"The answer is: 12.\n {FACT}", SEGMENT, READ)
    assert verdict.relevant and verdict.text == FACT
    assert verdict.evidence == (READ.index(FACT), READ.index(FACT) + len(FACT))
    assert "1 of its 2 sentences kept" in verdict.reason and "12" in verdict.reason
    # no sentence passes on its own: still dropped, and said why as a whole
    dropped = GroundedJudge().judge(QUESTION, "The ferry leaves at 9 pm. The bakery near the Carrow bridge was known "
                                    "for its bright rye bread.", SEGMENT, READ)
    assert not dropped.relevant and "sentences kept" not in dropped.reason


def test_grounded_rejects_the_question_paired_with_a_name_from_elsewhere() -> None:
    """Found as a bug (SmolLM2 wrote this margin on a haystack): 'leaves' (question: 'leave')
    counted as a rare new word found in the fact's sentence, so support was 0.6."""
    read = ("The bakery near the Carrow bridge was known for its rye bread. Children crossed "
            "the Carrow bridge to school. The road over the Carrow bridge was repaired in May. "
            f"{FACT} Traders sold wool.\n")
    margin = ("The pier that the night ferry to Brackwater leaves from is the pier that the "
              "Carrow Bridge is on.")
    verdict = GroundedJudge().judge(QUESTION, margin, Segment(0, 0, len(read), read, ()), read)
    assert not verdict.relevant


def test_find_evidence_weights_rare_words() -> None:
    text = "Carts cross the bridge. Carts cross the bridge daily. The pier 47 bridge is old."
    ev = find_evidence("Which bridge?", "pier 47 carts", text)
    assert ev is not None
    # 'pier' and '47' occur in one sentence of three, 'carts' in two: the third sentence wins
    assert text[ev.start:ev.end].strip() == "The pier 47 bridge is old."
    once, twice = math.log(1 + 3 / 1), math.log(1 + 3 / 2)
    assert ev.support == pytest.approx(2 * once / (2 * once + twice))
    assert find_evidence("Which bridge?", "bridge", text) is None  # nothing new


def test_separate_judge_asks_a_stateless_question() -> None:
    gen = ScriptedGenerator(replies=["YES", "no."])
    judge = SeparateJudge(gen)
    yes = judge.judge(QUESTION, FACT, SEGMENT, READ)
    no = judge.judge(QUESTION, "Pier 12.", SEGMENT, READ)
    empty = judge.judge(QUESTION, "NONE", SEGMENT, READ)
    assert yes.relevant and READ[slice(*yes.evidence)].strip() == FACT  # type: ignore[misc]
    assert not no.relevant and no.evidence is None
    assert not empty.relevant
    assert len(gen.requests) == 2  # the empty margin cost no request
    for req, note in zip(gen.requests, [FACT, "Pier 12."], strict=True):
        assert req.prefix_ids == ()
        assert f"Question: {QUESTION}\nNote: {note}\n" in req.suffix


def test_make_judge() -> None:
    gen = ScriptedGenerator()
    assert isinstance(make_judge("grounded", gen), GroundedJudge)
    assert isinstance(make_judge("separate", gen), SeparateJudge)
    for gone in ("telepathy", "fused", "combined"):
        with pytest.raises(UserError, match="choose one of grounded, separate"):
            make_judge(gone, gen)


def test_a_judge_takes_its_settings_when_made() -> None:
    judge = GroundedJudge(0.6, 0.3, link_sentences=0, clause_share=None)
    assert (judge.threshold, judge.topic_threshold, judge.link_sentences, judge.clause_share) == (0.6, 0.3, 0, None)
    default = GroundedJudge()
    assert (default.link_sentences, default.clause_share) == (LINK_SENTENCES, CLAUSE_SHARE)


def test_evidence_span_is_the_sentence_without_surrounding_space() -> None:
    text = "The road was quiet. The vault code is 4719. Rain fell."
    ev = find_evidence("What is the vault code?", "The vault code is 4719.", text)
    assert ev is not None
    assert text[ev.start:ev.end] == "The vault code is 4719."


# -- the faults of the first grounded judge (issue 16), each a test ------------------------------------------

def _judge(question: str, margin: str, read: str) -> Verdict:
    return GroundedJudge().judge(question, margin, Segment(0, 0, len(read), read, ()), read)


FLOOD = ("The flood came in spring. Dr. Smith measured the river each morning. The river rose 3.5 metres "
         "in May, the most since 1953. Boats were tied up for a week.")


def test_a_copied_sentence_with_a_decimal_or_a_title_is_kept_whole() -> None:
    """Sentences were split at every full stop: '3.5' and 'Dr. Smith' broke the match."""
    margin = "The river rose 3.5 metres in May, the most since 1953."
    verdict = _judge("How high did the river rise in May?", margin, FLOOD)
    assert verdict.relevant, verdict.reason
    assert FLOOD[slice(*verdict.evidence)] == margin  # type: ignore[misc]
    who = _judge("Who measured the river?", "Dr. Smith measured the river each morning.", FLOOD)
    assert who.relevant and FLOOD[slice(*who.evidence)] == "Dr. Smith measured the river each morning."  # type: ignore[misc]
    assert [FLOOD[s:e] for s, e in sentence_spans(FLOOD)][1:3] == [
        "Dr. Smith measured the river each morning.", "The river rose 3.5 metres in May, the most since 1953."]


def test_a_wrong_decimal_is_still_caught() -> None:
    verdict = _judge("How high did the river rise in May?", "The river rose 4.5 metres in May.", FLOOD)
    assert not verdict.relevant and "4.5" in verdict.reason


@pytest.mark.parametrize("margin", ["3.5 metres", "3.5 metres.", "It rose 3.5 metres."])
def test_a_short_correct_margin_without_a_question_word_is_kept(margin: str) -> None:
    """A margin had to share a word with the question: the bare answer was dropped."""
    verdict = _judge("How high did the river rise in May?", margin, FLOOD)
    assert verdict.relevant, verdict.reason


def test_a_lead_in_naming_the_passage_adds_no_new_words() -> None:
    """'According to the passage, ...' before a copied sentence halved its support (the eval model's needle
    margin scored 0.54 for the needle itself)."""
    margin = "According to the passage, the river rose 3.5 metres in May, the most since 1953."
    verdict = _judge("How high did the river rise in May?", margin, FLOOD)
    bare = _judge("How high did the river rise in May?", "The river rose 3.5 metres in May, the most since 1953.",
                  FLOOD)
    assert verdict.relevant and verdict.score == pytest.approx(bare.score), verdict.reason
    assert "100%" in verdict.reason or "copied" in verdict.reason


def test_the_bare_answer_is_kept_where_the_question_is() -> None:
    verdict = _judge(QUESTION, "47", READ)
    assert verdict.relevant and READ[slice(*verdict.evidence)] == FACT  # type: ignore[misc]


def test_a_copied_sentence_sharing_one_common_question_word_is_dropped() -> None:
    """Any copied sentence that shared one question word passed with a full score."""
    read = ("The ferry was painted blue in spring. The ferry carries forty cars. Tickets for the ferry are "
            f"sold on board. {FACT} Gulls follow the boats.")
    off = _judge(QUESTION, "The ferry was painted blue in spring.", read)
    assert not off.relevant and "of the question's words" in off.reason
    on = _judge(QUESTION, FACT, read)
    assert on.relevant and (on.score or 0) > (off.score or 0)


@pytest.mark.parametrize("question, margin, read", [
    ("新码头有多长？", "新码头长300米",
     "港口在2019年扩建。新码头长300米，由王先生设计。渔船每天早上出海。"),
    ("新しい埠頭の長さは？", "新しい埠頭は300メートルです",
     "港の拡張は2019年に行われた。新しい埠頭は300メートルです。漁船は毎朝出港する。"),
    ("ท่าเรือใหม่ยาวเท่าไร", "ท่าเรือใหม่ยาว 300 เมตร",
     "ท่าเรือขยายในปี 2562 ท่าเรือใหม่ยาว 300 เมตร เรือประมงออกทะเลทุกเช้า"),
])
def test_text_without_spaces_is_judged(question: str, margin: str, read: str) -> None:
    """Chinese, Japanese and Thai were always rejected: no spaces, so no words in common."""
    verdict = _judge(question, margin, read)
    assert verdict.relevant, verdict.reason
    assert margin.split()[0] in read[slice(*verdict.evidence)]  # type: ignore[misc]
    invented = _judge(question, margin.replace("300", "900"), read)
    assert not invented.relevant


def test_a_lone_letter_is_not_supported_by_an_abbreviation_or_a_contraction() -> None:
    """NIAH 16k, needle 4: SmolLM2's later margin "... is the "M" in Fenamar." was kept because its one new
    word, "m", was found in the sentence after the needle ("And the m.o. ... is the same"), and the answer
    took that note over the needle's. Abbreviations are one unit; a contraction's "m" or "t" is no unit."""
    read = ("You need two things: an idea and a partner. The combination of the old copper safe in Fenamar is "
            "9302655. And the m.o. for finding both is the same. I'm sure it won't change.")
    question = "What is the combination of the old copper safe in Fenamar?"
    assert _judge(question, "The combination of the old copper safe in Fenamar is 9302655.", read).relevant
    verdict = _judge(question, 'The combination of the old copper safe in Fenamar is the "M" in Fenamar.', read)
    assert not verdict.relevant, verdict.reason
    assert not _judge(question, 'The combination is the "T" in Fenamar.', read).relevant
    assert units("And the m.o. for it, in the U.S.The end") == ["m.o", "u.s", "end"]
    assert units("I'm sure we'll go; don't") == ["sur", "go", "don"]
    assert _judge("Where was the vote?", "The vote was in the U.S.", "The vote was held in the U.S. last May.").relevant


def test_units_of_unspaced_scripts_are_grapheme_pairs() -> None:
    assert units("新码头") == ["新码", "码头"]
    assert units("Pier 47, 3.5 m and 1,200 boats") == ["pier", "47", "3.5", "m", "1,200", "boat"]
    assert set(units("เรือประมง")) <= set(units("เรือประมงออกทะเล"))


def test_sentences_are_split_incrementally_as_the_reading_grows() -> None:
    whole = " ".join([FLOOD, FACT, READ, FLOOD.replace("May", "June")])
    grown = SentenceSplitter()
    for cut in (17, 40, 95, 160, 230, len(whole)):  # cuts inside "Dr. Smith" and "3.5" included
        grown.spans(whole[:cut])
    assert grown.spans(whole) == SentenceSplitter().spans(whole) == sentence_spans(whole)
    assert [whole[s:e] for s, e in sentence_spans(whole)][4] == FACT


def test_choice_probabilities_leave_the_cache_as_it_was() -> None:
    gen = ScriptedGenerator(replies=["0.8", "NO"])
    gen.prefill(gen.tokenizer.encode("some text read"))
    before = gen.cached_ids
    probs = gen.choice_probabilities(gen.tokenizer.encode("Is it? Reply YES or NO."), ("YES", "NO"))
    assert probs["YES"] == pytest.approx(0.8) and probs["NO"] == pytest.approx(0.2)
    assert gen.cached_ids == before
    assert gen.choice_probabilities(gen.tokenizer.encode("And now?"), ("YES", "NO"))["NO"] == pytest.approx(1.0)
    assert gen.requests[0].prefix == "some text read"


def test_a_rare_word_brought_in_from_another_sentence_is_dropped() -> None:
    """The answer's sentence with another place's name put in: each word was read, but not together."""
    read = (f"{FACT} The bakery near the Carrow bridge was known for its bright rye bread. Children crossed "
            "the bridge to school. Traders at the Lindholm market sold wool and honey from early morning.\n")
    verdict = _judge(QUESTION, "The night ferry to Lindholm leaves from pier 47.", read)
    assert not verdict.relevant and "'lindholm' comes from another part" in verdict.reason
    # a word the text never uses is a paraphrase, weighed by the threshold instead
    assert _judge(QUESTION, "The night ferry to Brackwater departs from pier 47.", read).relevant


# -- list margins: partial aggregates ---------------------------------------------------------------------

WORDS_READ = "1. lantern\n2. gravel\n3. lantern\n4. orchid\n5. gravel\n6. copper\n7. lantern\n"
WORDS_NEXT = "8. thimble\n9. orchid\n10. walnut\n"
COMMON = "The context is a numbered list of words, some of which repeat. What are the 3 most common words?"


def test_list_items_split_and_stay_short() -> None:
    assert list_items("lantern, gravel and orchid.") == ["lantern", "gravel", "orchid"]
    assert list_items("- lantern\n- gravel\n- lantern\n- orchid") == ["lantern", "gravel", "orchid"]
    assert list_items("1. lantern 2. gravel 3. orchid") == ["lantern", "gravel", "orchid"]
    assert list_items("3.5 metres, 1,200 tonnes, 7 ships") == ["3.5 metres", "1,200 tonnes", "7 ships"]
    assert list_items("lantern, gravel") == []  # two items: not a list
    assert list_items("The ferry, which leaves at dawn from the far pier, is late, they said.") == []


def test_a_list_of_words_from_the_part_just_read_is_kept_and_cites_it() -> None:
    read = WORDS_READ + WORDS_NEXT
    segment = Segment(1, len(WORDS_READ), len(read), WORDS_NEXT, ())
    verdict = GroundedJudge().judge(COMMON, "thimble, orchid, walnut", segment, read)
    assert verdict.relevant and verdict.score == 1.0 and "3 items" in verdict.reason
    assert verdict.evidence == (segment.start, segment.end)
    # a word cut off at the margin's token limit costs a share, not the whole list
    partial = GroundedJudge().judge(COMMON, "thimble, orchid, walnut, thimble, orchid, wal", segment, read)
    assert partial.relevant and partial.score == pytest.approx(3 / 4)


def test_a_list_the_part_does_not_hold_is_dropped() -> None:
    read = WORDS_READ + WORDS_NEXT
    segment = Segment(1, len(WORDS_READ), len(read), WORDS_NEXT, ())
    invented = GroundedJudge().judge(COMMON, "apple, bird, cloud, thimble", segment, read)
    assert not invented.relevant and invented.score == 0.25 and "25%" in invented.reason
    # words read in an earlier part are not this part's aggregate
    earlier = GroundedJudge().judge(COMMON, "lantern, gravel, copper", segment, read)
    assert not earlier.relevant


def test_a_supporting_sentence_beats_an_on_topic_one_that_shares_a_word() -> None:
    """The sentence a margin was drawn from is its evidence, even when another sentence holds more of the
    question's words but only one of the margin's (HotpotQA: an answer sentence lost to a distractor)."""
    question = "What government position was held by the woman who starred in the film Kiss and Tell?"
    text = ("Kiss and Tell is a film. A position within the government is held by the Deputy Prime "
            "Minister of State. Shirley Temple was an actress. As an adult, she was named ambassador to "
            "Ghana and served as Chief of Protocol of the State.")
    margin = "She was ambassador to Ghana and served as Chief of Protocol of the State."
    ev = find_evidence(question, margin, text)
    assert ev is not None and ev.support >= 0.5
    assert "Chief of Protocol" in text[ev.start:ev.end]


def test_a_name_the_question_gives_that_was_not_read_yet_keeps_a_margin_off_topic() -> None:
    """Before the text names Paul Baran, a sentence holding "developed" is not on "What did Paul Baran
    develop?" (the model writes "Paul Baran developed a theory of forces" from a segment about physics)."""
    judge = GroundedJudge()
    before = ("Newton developed a theory of forces. Leibniz developed calculus. The apple fell from the tree. "
              "Physics grew.")
    segment = Segment(0, 0, len(before), before, ())
    question = "What did Paul Baran develop?"
    off = judge.judge(question, "Paul Baran developed a theory of forces.", segment, before)
    assert not off.relevant and "'baran', which the text has not come to yet" in off.reason, off.reason
    after = before + " Paul Baran developed the concept of message block switching."
    segment = Segment(1, 0, len(after), after, ())
    on = judge.judge(question, "Paul Baran developed the concept of message block switching.", segment, after)
    assert on.relevant
    assert question_names(question) == {"paul", "baran"}
    assert question_names("WHAT DID PAUL BARAN DEVELOP?") == set()  # all capitals: no names to tell apart
    # a common word the text never uses still does not count against (a question may paraphrase)
    assert judge.judge("Which tool did he devise for splitting messages?",
                       "Paul Baran developed the concept of message block switching.", segment, after).relevant


def test_an_answer_made_of_the_question_words_is_not_a_restatement() -> None:
    """'Kansas Song', the fight song of the university in Lawrence, Kansas: every word of the answer is in the
    question, in another order; the margin was dropped as adding nothing. Restating the question (or its
    options reordered) still adds nothing, and an order the text never states is not supported."""
    read = ("The University of Kansas is a public university in Lawrence, Kansas. Its best-known fight song "
            "is the Kansas Song, first sung in 1912. The campus sits on Mount Oread.")
    question = "What is the fight song of the university in Lawrence, Kansas?"
    verdict = _judge(question, "The fight song is the Kansas Song.", read)
    assert verdict.relevant and "Kansas Song" in read[slice(*verdict.evidence)], verdict.reason  # type: ignore[misc]
    assert _judge(question, "The fight song of the university in Lawrence, Kansas.", read).reason \
        == "the margin adds nothing to the question"
    older = _judge("Who is older, Ann Lee or Bo Ray?", "Bo Ray is older than Ann Lee.",
                   "Ann Lee was born in 1950. Bo Ray was born in Leeds.")
    assert not older.relevant


def test_the_sentence_before_lends_its_topic_only_within_its_paragraph() -> None:
    """A passage placed after the gold one began with a sentence that took the question's words from the
    gold passage's last sentence; across a blank line that sentence is another passage's."""
    lead = "Gulls wheel over the harbour of Kettleby. The night ferry to Brackwater is the last boat out."
    other = "Wool and honey were sold at the Lindholm market from early morning."
    same = _judge(QUESTION, other, f"{lead} {other}\n")
    apart = _judge(QUESTION, other, f"{lead}\n\n{other}\n")
    assert same.relevant
    assert not apart.relevant and "of the question's words" in apart.reason


def test_question_words_the_document_uses_later_count_against_an_early_margin() -> None:
    """Read early, a copied sentence holding the question's two commonest words ("use", "study") was kept on
    them alone, as the question's other words were not read yet. Given the whole document, the words it uses
    further on count against that sentence; a word the document never uses still does not (a paraphrase)."""
    early = "Field geologists use hammers and lenses to study the rocks of a cliff. The quarry closed in 1950."
    later = (" On a cold, clear winter night the astronomers at Ravel used a reflecting telescope to study the"
             " tail of a comet.")
    document = early + later
    question = "What did the astronomers use to study the comet's tail during the cold, clear winter night?"
    margin = "Field geologists use hammers and lenses to study the rocks of a cliff."
    judge = GroundedJudge()
    segment = Segment(0, 0, len(early), early, ())
    assert judge.judge(question, margin, segment, early).relevant  # the read part alone cannot tell
    off = judge.judge(question, margin, segment, early, document=document)
    assert not off.relevant and "of the question's words" in off.reason
    whole = Segment(1, len(early), len(document), later, ())
    on = judge.judge(question, "a reflecting telescope", whole, document, document=document)
    assert on.relevant, on.reason
    assert judge.judge("Which device helped the astronomers at Ravel?", "a reflecting telescope", whole, document,
                       document=document).relevant  # "device", "helped": never used, left out


def test_a_margin_that_speaks_of_what_was_not_read_yet_is_dropped() -> None:
    """"The University of Chicago is a public university", drawn on a sentence about public universities in
    Michigan before Chicago was read: the one word it adds ("public") is there, and the question's commoner
    words, but the text has not come to its subject yet. Joining a subject read in one passage to a fact read
    in another is what a multi-hop answer does, and stays."""
    michigan = ("The network linked three campuses in Ohio. It later joined the public universities of Michigan "
                "to one university network, with terminals in every university library.")
    chicago = " Varnholt University in Chicago is a private research university, founded in 1890."
    document = michigan + chicago
    question = "What kind of university is Varnholt University?"
    margin = "Varnholt University is a public university."
    judge = GroundedJudge()
    segment = Segment(0, 0, len(michigan), michigan, ())
    early = judge.judge(question, margin, segment, michigan, document=document)
    assert not early.relevant and "'varnholt', which the text has not come to yet" in early.reason, early.reason
    judge.cover_threshold = 0.0
    assert judge.judge(question, margin, segment, michigan, document=document).relevant  # what the check adds
    judge.cover_threshold = GroundedJudge().cover_threshold
    whole = Segment(1, len(michigan), len(document), chicago, ())
    assert judge.judge(question, "Varnholt University is a private research university.", whole, document,
                       document=document).relevant
    # multi-hop: the question's subject (read in the first passage) joined to the second passage's fact
    read = ("Kiss and Tell is a 1945 film in which Shirley Temple plays Corliss Archer.\n\n"
            "Shirley Temple Black was an actress and diplomat. As an adult she served as Chief of Protocol of the "
            "United States.")
    hop = judge.judge("What post did the diplomat Shirley Temple, who played Corliss Archer in Kiss and Tell, "
                      "hold as an adult?",
                      "Shirley Temple, who played Corliss Archer in Kiss and Tell, served as Chief of Protocol.",
                      Segment(0, 0, len(read), read, ()), read, document=read)
    assert hop.relevant, hop.reason


def test_a_multi_hop_margin_takes_the_question_from_the_passage_that_names_its_subject() -> None:
    """"The woman who portrayed Corliss Archer ... served as Chief of Protocol": the fact's passage is on
    Shirley Varga and holds none of the question's words; the passage that casts her as Corliss Archer does, and
    it names the fact passage's subject. The same margin drawn on a passage nothing links to is dropped, and a
    heading every passage opens with ("Title") links nothing."""
    paragraphs = [
        "Title: Harbour Lights\nHarbour Lights is a 1952 drama about a lighthouse keeper. It was filmed in Cornwall.",
        "Title: Kiss and Tell\nKiss and Tell is a 1945 comedy film starring Shirley Varga as Corliss Archer. The "
        "film was shot in Los Angeles over six weeks.",
        "Title: Doris Lemke\nDoris Lemke was a stage actress from Ohio. As an adult, she served as mayor of Dayton.",
        "Title: Shirley Varga\nShirley Varga was an actress and diplomat. She appeared in forty films as a child. As "
        "an adult, she served as Chief of Protocol of the United States.",
        "Title: Quarry Road\nQuarry Road is a 1961 western shot in Utah. Its score was lost in a fire.",
    ]
    text = "\n\n".join(paragraphs)
    question = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"
    said = "The woman who portrayed Corliss Archer in the film Kiss and Tell served as "
    segment = Segment(0, 0, len(text), text, ())
    judge = GroundedJudge()
    right = judge.judge(question, said + "Chief of Protocol of the United States.", segment, text, document=text)
    assert right.relevant and "'shirley' it links to" in right.reason, right.reason
    assert right.evidence and "Chief of Protocol" in text[right.evidence[0]:right.evidence[1]]
    wrong = judge.judge(question, said + "mayor of Dayton.", segment, text, document=text)
    assert not wrong.relevant, wrong.reason
    unlinked = GroundedJudge(link_sentences=0).judge(question, said + "Chief of Protocol of the United States.",
                                                     segment, text, document=text)
    assert not unlinked.relevant, unlinked.reason  # what the link adds
    # a first name alone links nothing: the passage casting "John Pell" is not about John Okafor
    paragraphs[1] = paragraphs[1].replace("Shirley Varga", "John Pell")
    paragraphs[3] = paragraphs[3].replace("Shirley Varga", "John Okafor")
    text = "\n\n".join(paragraphs)
    segment = Segment(0, 0, len(text), text, ())
    first_name = judge.judge(question, said + "Chief of Protocol of the United States.", segment, text, document=text)
    assert not first_name.relevant, first_name.reason


def test_a_sentence_that_answers_one_clause_of_a_composite_question_is_on_it() -> None:
    """A question of several clauses ("Which company, praised by ... for ..., was fined by ... for ..., and later
    opened ...?") asks several things; the sentence that answers one holds little of the whole question. Its
    margin is kept when the sentence holds half of one clause's words; one sharing a single word with a clause
    is not, and without the clause rule the right margin is dropped too."""
    paragraphs = [
        "Title: Brightforge\nBrightforge makes stoneware in the hills above Carrow. Critics praise the glaze of its "
        "salt kilns above all others.",
        "Title: Dunmore Works\nDunmore Works burns coal in its brick kilns. Its slag heaps stand beside the railway.",
        "Title: The Vell\nThe Vell is a river that floods every spring. Its water is dumped into the sea at Osterby.",
        "Title: Lunden\nLunden has a school of music and a training college for nurses. It opened a new library in "
        "1990.",
    ]
    text = "\n\n".join(paragraphs)
    question = ("Which company, praised by the Harwick Ledger for the glaze of its salt kilns, was fined by the "
                "Osterby council for dumping slag into the Vell river in the spring floods, and later opened a "
                "training school for potters in Lunden?")
    segment = Segment(0, 0, len(text), text, ())
    judge = GroundedJudge()
    right = judge.judge(question, "Brightforge: critics praise the glaze of its salt kilns.", segment, text,
                        document=text)
    assert right.relevant, right.reason
    assert "clause 'praised by the Harwick Ledger for the glaze of its salt kilns'" in right.reason, right.reason
    one_word = judge.judge(question, "Dunmore Works burns coal in its brick kilns.", segment, text, document=text)
    assert not one_word.relevant, one_word.reason
    whole_only = GroundedJudge(clause_share=None).judge(
        question, "Brightforge: critics praise the glaze of its salt kilns.", segment, text, document=text)
    assert not whole_only.relevant, whole_only.reason  # what the clause rule adds
    assert question_clauses("Who founded the company that makes the Vell kettle?") == []
