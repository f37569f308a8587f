"""The benchmark report: tables with counts and 95% intervals, cost per pattern, the header, and valid PNGs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marginalia.bench.analysis import cores_text, find_run, load_run, primary_metric, run_machines
from marginalia.bench.report import write_report
from marginalia.bench.statistics import bootstrap, estimate, wilson
from marginalia.errors import UserError

PNG = b"\x89PNG\r\n\x1a\n"


def result(pattern: str, length: int, depth: float, contains: float, f1: float, em: float = 0.0,
           status: str = "ok", verdict: str | None = None, task: str = "squad", n: int = 0,
           seconds: float = 1.0, prefilled: int = 1000, generated: int = 10) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema": 1, "task": task, "item_id": f"{task}/q{n}/{length}/d{depth}", "example_id": f"q{n}",
        "pattern": pattern, "kind": pattern, "target_tokens": length, "context_tokens": length - 10,
        "depth": depth, "distractor_fraction": None, "scoring": "qa", "question": "Q?", "answers": ["a"],
        "status": status,
    }
    if status == "ok":
        record.update(prediction="a", scores={"em": em, "f1": f1, "contains": contains},
                      judge={"verdict": verdict, "reason": "", "attempts": 1, "seconds": 0.5} if verdict else None,
                      stats={"context_tokens": length - 10, "prefilled_context_tokens": prefilled,
                             "prefilled_other_tokens": 50, "generated_margin_tokens": 0,
                             "generated_answer_tokens": generated, "generated_other_tokens": 0,
                             "total_seconds": seconds})
    else:
        record.update(prediction=None, scores=None, judge=None, stats=None, error="too long")
    return record


INFO = {
    "schema": 1, "started": "2025-01-02T03:04:05+00:00",
    "config": {"name": "fixture", "model": "smollm2",
               "patterns": [{"name": "wim", "kind": "wim"}, {"name": "lc", "kind": "lc"}]},
    "commit": {"commit": "0123456789abcdef0123", "dirty": True},
    "models": {"generator": {"spec": "smollm2", "name": "smollm2", "engine": "LlamaCppGenerator",
                             "device": "cpu", "context_window": 8192},
               "embedder": "minilm", "judge": None},
    "machine": {"cpu": "Test CPU", "cores": 2, "ram_gb": 8.0, "gpus": []},
}


def fixture_run(folder: Path, records: list[dict[str, Any]], info: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(INFO if info is None else info))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def lexical_records() -> list[dict[str, Any]]:
    records = []
    # lc at 1000 tokens, depth 0: contains 1,1,0,1 (3/4); F1 0.5, 1, 0, 0.5
    for n, (c, f) in enumerate([(1, 0.5), (1, 1.0), (0, 0.0), (1, 0.5)]):
        records.append(result("lc", 1000, 0.0, c, f, em=float(f == 1.0), n=n, seconds=2.0))
    # lc at 1000, depth 1: 1/2, one overflow
    records.append(result("lc", 1000, 1.0, 1, 1.0, em=1.0, n=0, seconds=4.0))
    records.append(result("lc", 1000, 1.0, 0, 0.2, n=1, seconds=4.0))
    records.append(result("lc", 2000, 0.0, 0, 0, status="overflow", n=0))
    # wim at 1000, depth 0: 2/2; one error at depth 1
    records.append(result("wim", 1000, 0.0, 1, 1.0, em=1.0, n=0, prefilled=900, generated=100, seconds=6.0))
    records.append(result("wim", 1000, 0.0, 1, 0.8, n=1, prefilled=900, generated=200, seconds=8.0))
    records.append(result("wim", 1000, 1.0, 0, 0, status="error", n=0))
    return records


def test_wilson_and_bootstrap() -> None:
    low, high = wilson(3, 4)
    assert (round(low, 4), round(high, 4)) == (0.3006, 0.9544)  # the textbook Wilson interval
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    lo, hi = bootstrap([0.5, 1.0, 0.0, 0.5])
    assert 0.0 <= lo < 0.5 < hi <= 1.0 and bootstrap([0.5, 1.0, 0.0, 0.5]) == (lo, hi)  # seeded
    assert bootstrap([0.3]) == (0.3, 0.3)
    est = estimate([1.0, 1.0, 0.0, 1.0])
    assert (est.n, est.mean, est.format()) == (4, 0.75, "0.75 [0.30, 0.95]")
    assert estimate([]).format() == "–" and estimate([]).n == 0
    assert estimate([0.5, 1.0]).low == bootstrap([0.5, 1.0])[0]


def test_report_tables_counts_and_plots(tmp_path: Path) -> None:
    folder = fixture_run(tmp_path / "run", lexical_records())
    # a kill left half a line: the report ignores it
    with (folder / "results.jsonl").open("a") as f:
        f.write('{"task": "squad", "item_id": "x", "pat')
    files = write_report(folder)
    text = files.report.read_text()
    assert files.report == folder / "report.md"

    # the header: config name, model, commit, date, machine, totals
    assert text.startswith("# Benchmark report: fixture\n")
    assert "smollm2 (LlamaCppGenerator, device cpu, window 8192 tokens)" in text
    assert "0123456789ab (with uncommitted changes)" in text and "2025-01-02T03:04:05+00:00" in text
    assert "2 cores (Test CPU)" in text
    assert "**results**: 10 (8 answered, 1 overflow, 1 error)" in text
    assert "Primary score: **contains**." in text

    # pattern x length x depth, wim first (the config's order), with n, the CI, EM/F1 and counts
    header = "| pattern | length | depth | n | contains (95% CI) | em | f1 | overflow | error |"
    assert header in text
    assert "| lc | 1000 | 0.00 | 4 | 0.75 [0.30, 0.95] | 0.25 | 0.50 | 0 | 0 |" in text
    assert "| lc | 1000 | 1.00 | 2 | 0.50 [0.09, 0.91] | 0.50 | 0.60 | 0 | 0 |" in text
    assert "| lc | 2000 | 0.00 | 0 | – | – | – | 1 | 0 |" in text
    assert "| wim | 1000 | 0.00 | 2 | 1.00 [0.34, 1.00] | 0.50 | 0.90 | 0 | 0 |" in text
    assert "| wim | 1000 | 1.00 | 0 | – | – | – | 0 | 1 |" in text
    assert text.index("| wim | 1000 | 0.00") < text.index("| lc | 1000 | 0.00")
    # pooled over depths
    assert "| lc | 1000 | 6 | 0.67 [0.30, 0.90] | 0.33 | 0.53 | 0 | 0 |" in text

    # cost per pattern: means over answered items
    assert "| wim | 2 | 900 | 50 | 150.0 | 7.00 | – | 0 | 1 |" in text
    assert "| lc | 6 | 1000 | 50 | 10.0 | 2.67 | – | 1 | 0 |" in text

    names = sorted(p.name for p in files.plots)
    assert names == ["cost.png", "heatmap-squad-lc.png", "heatmap-squad-wim.png", "recommendation.png",
                     "score-squad.png"]
    for path in files.plots:
        assert path.read_bytes()[:8] == PNG and path.stat().st_size > 2000
        assert f"![{path.name}]({path.name})" in text
    import matplotlib.image

    assert matplotlib.image.imread(folder / "score-squad.png").shape[2] in (3, 4)


def test_report_uses_the_judge_when_it_gave_verdicts(tmp_path: Path) -> None:
    records = [result("lc", 1000, 0.5, 1, 1.0, verdict=v, n=i)
               for i, v in enumerate(["correct", "correct", "wrong", "unjudged", "correct"])]
    folder = fixture_run(tmp_path / "run", records)
    (folder / "disagreements.jsonl").write_text(json.dumps(
        {"task": "squad", "item_id": records[2]["item_id"], "pattern": "lc", "kind": "judge_wrong_exact_match"}
    ) + "\n")
    assert primary_metric(records) == "judge"
    text = write_report(folder, plots=False).report.read_text()
    assert "Primary score: **judge accuracy**." in text
    # 3 of 4 judged correct; the unjudged one is counted apart
    assert "| lc | 1000 | 0.50 | 4 | 0.75 [0.30, 0.95] | 0.00 | 1.00 | 1.00 | 1 | 0 | 0 |" in text
    assert "4 judged, 1 unjudged; 1 disagreements" in text
    assert "| lc | 5 | 1000 | 50 | 10.0 | 1.00 | 0.50 | 0 | 0 |" in text
    assert not list(folder.glob("*.png"))


def test_set_tasks_default_to_f1_and_size_sweeps_to_distractors(tmp_path: Path) -> None:
    records = []
    for i, fraction in enumerate([0.0, 0.5, 1.0]):
        r = result("rag", 4000, 0.0, 1.0, 0.4 + 0.1 * i, task="cwe", n=i)
        r.update(depth=None, distractor_fraction=fraction, scoring="set")
        records.append(r)
    assert primary_metric(records) == "f1"
    judged = [{**r, "judge": {"verdict": "correct"}} for r in records]  # as a run judged before the rule
    assert primary_metric(judged) == "f1"  # a word list is scored as a set, never by a verdict on it
    folder = fixture_run(tmp_path / "run", records, info={})
    files = write_report(folder)
    text = files.report.read_text()
    assert "| pattern | length | distractors | n | f1 (95% CI) | em | contains | overflow | error |" in text
    assert "| rag | 4000 | 0.50 | 1 | 0.50 [0.50, 0.50] | 0.00 | 1.00 | 0 | 0 |" in text
    assert "# Benchmark report: run" in text and "unknown (not a git checkout)" in text
    # one length: the score plot only (a heatmap of one column would say nothing more)
    assert sorted(p.name for p in files.plots) == ["cost.png", "recommendation.png", "score-cwe.png"]
    assert (folder / "score-cwe.png").read_bytes()[:8] == PNG


def test_patterns_compared_on_the_same_items(tmp_path: Path) -> None:
    """Paired differences with bootstrap intervals, judge-vs-contains disagreement, cost per task and
    length, and bars with error bars for a run at one depth."""
    records = []
    for n in range(30):
        wim_right, lc_right = n % 10 != 0, n % 2 == 0  # wim 27/30, lc 15/30
        records.append(result("wim", 4000, 0.5, float(wim_right), 1.0, n=n, verdict="correct" if wim_right
                              else "wrong", seconds=6.0))
        records.append(result("lc", 4000, 0.5, float(lc_right), 1.0, n=n,
                              verdict="correct" if lc_right or n == 1 else "wrong", seconds=2.0))
    records.append(result("lc", 4000, 0.5, 1.0, 1.0, n=99, verdict="correct"))  # lc alone: not paired
    folder = fixture_run(tmp_path / "run", records)
    files = write_report(folder)
    text = files.report.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| wim − lc | 4000 | 30 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    mean, interval = cells[3].split(" ", 1)
    assert float(mean) == pytest.approx((27 - 16) / 30, abs=0.005)  # lc's judge accepts item 1 too
    low, high = (float(v) for v in interval.strip("[]").split(", "))
    assert 0 < low < float(mean) < high
    assert cells[4:] == ["14", "3", "wim higher"]
    # the judge accepted one lc answer that contains no gold answer
    assert "| lc | 31 | 0.03 | 1 | 0 |" in text and "| wim | 30 | 0.00 | 0 | 0 |" in text
    assert "| wim | 4000 | 30 | 1000 | 50 | 10.0 | 6.00 |" in text
    assert sorted(p.name for p in files.plots) == ["cost.png", "recommendation.png", "score-squad.png"]


def test_find_run_by_name_or_folder(tmp_path: Path, hermetic: Path) -> None:
    named = fixture_run(hermetic / "bench" / "runs" / "fixture", lexical_records())
    assert find_run("fixture") == named
    assert find_run(named) == named
    with pytest.raises(UserError, match="no benchmark run"):
        find_run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.json").write_text("{}")
    with pytest.raises(UserError, match="no results yet"):
        write_report(tmp_path / "empty")
    assert load_run(named).disagreements == 0


def test_report_gives_kept_margin_precision_and_recall(tmp_path: Path) -> None:
    def margin(text: str, kept: bool) -> dict[str, Any]:
        return {"segment": 0, "text": text, "kept": kept, "reason": "r", "score": 1.0 if kept else 0.0}

    one = result("wim", 1000, 0.0, 1, 1.0, n=0)
    one["answers"] = ["pier 47"]
    # kept: one with the answer, one without; dropped: one with the answer
    one["margins"] = [margin("It leaves from Pier 47.", True), margin("The bakery sells bread.", True),
                      margin("pier 47", False), margin("NONE", False)]
    two = result("wim", 1000, 1.0, 0, 0.0, n=1)
    two["answers"] = ["1997"]
    two["margins"] = [margin("In 1997.", False), margin("NONE", False)]  # written, never kept
    old = result("wim", 1000, 1.0, 1, 1.0, n=2)
    old["margins"] = 3  # schema 1 kept only the count: left out
    # a repeat of the kept note is not a lost answer; a yes/no question cannot be scored by its margins
    one["margins"].append({**margin("It leaves from Pier 47.", False), "reason": "repeats an earlier note"})
    yes_no = result("wim", 1000, 0.5, 1, 1.0, n=3)
    yes_no["answers"] = ["no"]
    yes_no["margins"] = [margin("NO", False), margin("No, they are not.", True)]
    lc = result("lc", 1000, 0.0, 1, 1.0, n=0)
    text = write_report(fixture_run(tmp_path / "run", [one, two, old, yes_no, lc]),
                        plots=False).report.read_text()
    assert "| pattern | n | kept | precision | recall | recall, each copy | questions with a kept answer | kept from " \
        "a gold passage |" in text
    # 2 kept, 1 with the answer; 3 answer-bearing notes (each one copy), 1 kept; questions: 2 with one written, 1
    # kept; no spans kept
    assert "| wim | 2 | 2 | 0.50 | 0.33 | 0.33 | 1 of 2 | – |" in text
    assert "| lc |" not in text.split("### Margins kept")[1].split("##")[0]
    # with the gold passages' spans and each margin's evidence: the bakery note lies outside the gold passage
    one["gold_spans"] = [[100, 200]]
    one["margins"][0]["evidence"], one["margins"][1]["evidence"] = [150, 170], [300, 320]
    text = write_report(fixture_run(tmp_path / "spans", [one, two, old, yes_no, lc]),
                        plots=False).report.read_text()
    assert "| wim | 2 | 2 | 0.50 | 0.33 | 0.33 | 1 of 2 | 0.50 |" in text


def test_rescore_uses_todays_metrics_and_says_how_many_changed(tmp_path: Path) -> None:
    """A run answered before a metric fix: --rescore scores the stored answers again; results.jsonl stays."""
    stale = result("lc", 1000, 0.0, 0.0, 0.0, n=0)  # as if an older metric missed "Orla Maye's"
    fresh = result("lc", 1000, 0.0, 1.0, 1.0, em=1.0, n=1)
    stale.update(prediction="the Orla Maye's crew", answers=["Orla Maye"])
    fresh.update(prediction="Orla Maye", answers=["Orla Maye"])
    fresh["scores"]["abstained"] = 0.0
    folder = fixture_run(tmp_path / "run", [stale, fresh])
    before = (folder / "results.jsonl").read_text()
    assert load_run(folder).rescored == 0 and load_run(folder).records[0]["scores"]["contains"] == 0.0
    data = load_run(folder, rescore_answers=True)
    assert data.rescored == 1
    assert data.records[0]["scores"]["contains"] == 1.0 and data.records[0]["stored_scores"]["contains"] == 0.0
    text = write_report(folder, plots=False, rescore=True).report.read_text()
    assert "1 answers scored again with today's metrics" in text
    assert "| lc | 1000 | 0.00 | 2 | 1.00 [0.34, 1.00] |" in text
    assert (folder / "results.jsonl").read_text() == before


def test_report_counts_yes_no_answers_contains_cannot_score(tmp_path: Path) -> None:
    from marginalia.bench.metrics import says_neither_yes_nor_no

    assert says_neither_yes_nor_no("X and Y were of the same nationality.", ["yes"])
    assert not says_neither_yes_nor_no("No, they were not.", ["yes"])  # wrong, but scorable
    assert not says_neither_yes_nor_no("Yes.", ["Yes"]) and not says_neither_yes_nor_no("Paris", ["Paris"])
    assert not says_neither_yes_nor_no("nothing", [])
    records = []
    for n, prediction in enumerate(["Yes, both.", "They were both American.", "The same country.", "no"]):
        r = result("lc", 1000, 0.0, 0.0, 0.0, n=n)
        r.update(prediction=prediction, answers=["yes"])
        records.append(r)
    other = result("lc", 1000, 0.0, 1.0, 1.0, n=9)
    records.append(other)
    text = write_report(fixture_run(tmp_path / "run", records), plots=False).report.read_text()
    assert "### Yes/no questions" in text and "| lc | 4 | 2 | 0.50 |" in text


def test_paired_and_margin_counts() -> None:
    """Two patterns on the items both answered: the mean difference, who was higher where; margins kept that
    bear a gold answer, a repeat of a kept note not counted as lost, yes/no questions and questions naming
    their own answer left out."""
    from marginalia.bench.analysis import margin_counts, paired

    def rec(item: str, pattern: str, contains: float, margins: list[dict[str, Any]] | None = None,
            answers: tuple[str, ...] = ("pier 47",), question: str = "Where does the ferry leave from?",
            ) -> dict[str, Any]:
        return {"item_id": item, "pattern": pattern, "status": "ok", "target_tokens": 100, "scores":
                {"contains": contains}, "answers": list(answers), "margins": margins or [], "kind": pattern,
                "question": question}

    def m(text: str, kept: bool, reason: str = "", read_to: int | None = None) -> dict[str, Any]:
        return {"text": text, "kept": kept, "reason": reason, "read_to": read_to}

    records = [rec("a", "wim", 1.0, [m("It leaves from pier 47.", True),
                                     m("Pier 47.", False, "repeats an earlier note"), m("The bakery.", True)]),
               rec("a", "lc", 0.0),
               rec("b", "wim", 0.0, [m("Pier 47, they say.", False, "only 20% of its new words")]),
               rec("b", "lc", 1.0), rec("c", "wim", 1.0), rec("c", "lc", 0.0),
               rec("d", "wim", 1.0), rec("y", "wim", 1.0, [m("yes", True)], answers=("yes",)),
               rec("o", "wim", 1.0, [m("Ann Lee", False, "adds nothing"), m("Bo Ray is older.", True)],
                   answers=("Ann Lee",), question="Who is older, Ann Lee or Bo Ray?")]
    memory = rec("g", "wim", 0.0, [m("Pier 47, I recall.", False, "none of its words read", read_to=90),
                                    m("Pier 12.", True, read_to=90), m("Pier 47 it is.", False, "too little",
                                                                       read_to=300)])
    memory["gold_spans"] = [[120, 200]]
    d = paired(records, "wim", "lc", "contains")
    assert d is not None and d.items == 3 and d.first_higher == 2 and d.second_higher == 1
    assert d.mean == pytest.approx(1 / 3) and d.low <= d.mean <= d.high
    assert paired(records, "wim", "rag", "contains") is None
    assert paired(records, "wim", "lc", "contains", length=200) is None
    c = margin_counts(records, "wim")
    assert (c.answers, c.kept, c.hits, c.bearing, c.asked, c.found) == (2, 2, 1, 2, 2, 1)
    # written before the gold passage was read, dropped: not counted against recall (one written after is)
    g = margin_counts([*records, memory], "wim")
    assert (g.answers, g.kept, g.hits, g.bearing, g.asked, g.found) == (3, 3, 1, 3, 3, 1)
    assert c.precision == 0.5 and c.recall == 0.5
    assert margin_counts(records, "lc").precision is None
    assert c.relevant_precision == 0.5  # no gold passages known: relevant means holding the answer


def test_recall_counts_notes_a_margin_written_again_with_the_same_words_counts_once() -> None:
    """A small model writes the answer again after each part once it has read it; nine copies dropped and one
    kept is one note kept (each copy apart: a tenth). The text-free copy (`same_as`) counts the same."""
    from marginalia.bench.analysis import margin_counts
    from marginalia.bench.export import strip_record

    margins = [{"text": "1999", "kept": False, "reason": "too little of the question"} for _ in range(9)]
    margins += [{"text": "1999.", "kept": True, "evidence": [10, 40]},
                {"text": "It was 1838.", "kept": False, "reason": "too little of the question"},
                {"text": "The bakery.", "kept": True, "evidence": [50, 60]}]
    record = {"item_id": "a", "pattern": "wim", "status": "ok", "answers": ["1999", "1838"], "margins": margins,
              "question": "What year did the band play the promo?"}
    c = margin_counts([record], "wim")
    assert (c.bearing, c.noted, c.copies, c.copies_kept, c.kept, c.hits) == (2, 1, 11, 1, 2, 1)
    assert c.recall == 0.5 and c.copy_recall == pytest.approx(1 / 11) and c.precision == 0.5
    free = strip_record(record)
    assert all("text" not in m for m in free["margins"])
    assert [m.get("same_as") for m in free["margins"]] == [None, *[0] * 9, None, None]
    f = margin_counts([free], "wim")
    assert (f.bearing, f.noted, f.copies, f.copies_kept) == (c.bearing, c.noted, c.copies, c.copies_kept)
    old = {**free, "margins": [{k: v for k, v in m.items() if k != "same_as"} for m in free["margins"]]}
    assert margin_counts([old], "wim").bearing == 11  # exported before notes were known: each copy its own


def test_margin_precision_counts_bridge_facts_only_with_several_gold_passages() -> None:
    """A kept margin drawn from a gold passage is relevant without the answer only when the question needs
    several gold passages (a multi-hop bridge); with one gold passage it must hold the answer."""
    from marginalia.bench.analysis import margin_counts

    def rec(item: str, spans: list[list[int]]) -> dict[str, Any]:
        margins = [{"text": "The ferry company is Tidewater Lines.", "kept": True, "evidence": [10, 40]},
                   {"text": "The ferry leaves from pier 47.", "kept": True, "evidence": [60, 90]},
                   {"text": "The bakery opens at six.", "kept": True, "evidence": [300, 330]}]
        return {"item_id": item, "pattern": "wim", "status": "ok", "answers": ["pier 47"], "margins": margins,
                "question": "Where does the ferry of the company leave from?", "gold_spans": spans}

    two = margin_counts([rec("a", [[0, 50], [55, 100]])], "wim")
    assert (two.kept, two.hits, two.relevant, two.located, two.on_gold) == (3, 1, 2, 3, 2)
    assert two.precision == pytest.approx(1 / 3) and two.relevant_precision == pytest.approx(2 / 3)
    one = margin_counts([rec("b", [[0, 100]])], "wim")
    assert (one.hits, one.relevant, one.on_gold) == (1, 1, 2)


def test_cores_text_says_when_a_run_was_held_to_fewer_cores() -> None:
    assert cores_text({"cores": 2}) == "2 cores"
    assert cores_text({"cores": 2, "usable_cores": 2}) == "2 cores"
    assert cores_text({"cores": 2, "usable_cores": 1}) == "1 of 2 cores"  # taskset -c 0
    assert cores_text({}) == "? cores"
    assert cores_text({"cores": None, "usable_cores": 1}) == "1 of ? cores"  # os.cpu_count() could not tell
    assert cores_text({"cores": 2, "usable_cores": 1, "jobs": 2}) == "2 cores, as 2 jobs of 1 core"  # --jobs 2
    assert cores_text({"cores": 8, "usable_cores": 4, "jobs": 2}) == "8 cores, as 2 jobs of 4 cores"


def test_run_machines_counts_a_run_held_to_all_its_cores_as_the_same_machine() -> None:
    old, new, pinned = {"cpu": "C", "cores": 2}, {"cpu": "C", "cores": 2, "usable_cores": 2}, \
        {"cpu": "C", "cores": 2, "usable_cores": 1}
    info = {"invocations": [{"machine": old}, {"machine": new}, {"machine": pinned}, {"machine": None}, {}]}
    assert run_machines(info) == [old, pinned]
    assert run_machines({}) == []


def test_a_count_the_server_did_not_report_is_unknown_in_the_cost(tmp_path: Path) -> None:
    records = lexical_records()
    for r in records:  # wim ran on a model server that did not say what it took from its prompt cache
        if r["pattern"] == "wim" and r.get("stats"):
            r["stats"].update(prefilled_context_tokens=None, prefilled_other_tokens=None)
    files = write_report(fixture_run(tmp_path / "run", records))
    text = files.report.read_text()
    assert "| wim | 2 | – | – | 150.0 | 7.00 | – | 0 | 1 |" in text  # unknown, not 0 and not a crash
    assert "| lc | 6 | 1000 | 50 | 10.0 | 2.67 | – | 1 | 0 |" in text
    assert (tmp_path / "run" / "cost.png").read_bytes()[:8] == PNG
