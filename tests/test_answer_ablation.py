"""benchmarks/answer_ablation.py: the paired report of two answer styles (records made up here)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load
from marginalia.bench.items import Item


def _item(n: int, gold: str) -> Item:
    return Item(id=f"t/{n}", task="t", example_id=str(n), question=f"Which pier, {n}?", answers=(gold,),
                context="", context_tokens=0)


def test_the_report_pairs_the_styles_and_the_patterns() -> None:
    ablation = load("answer_ablation")
    items = [_item(n, "Pier 47") for n in range(4)]
    said = {  # (wim, lc) answers under sentence, then lead
        0: (("The pier.", "Pier 47 it is."), ("The pier.", "The pier.")),
        1: (("Pier 47.", "Pier 47."), ("Pier 47.", "Pier 47.")),
        2: (("It is the pier.", "Pier 47."), ("No.", "Pier 47.")),
        3: (("Pier 47.", "The pier."), ("The pier.", "The pier.")),
    }
    done = {}
    for n, (wim, lc) in said.items():
        for kind, (sentence, lead) in (("wim", wim), ("lc", lc)):
            done[(f"t/{n}", kind)] = {"answers": {"sentence": sentence, "lead": lead}, "seconds": 1.0,
                                      "commit": "abc"}
    body = ablation.report({"t": items}, done, ("sentence", "lead"), "demo", "scripted", 0.0)
    rows = {line.split("|")[2].strip(): line for line in body.splitlines() if line.startswith("| t | ")}
    # wim: right 2 then 3 (item 0 gained, item 2 gained, item 3 lost): +0.25; lc: 1 then 2 (item 2 gained)
    wim = [c.strip() for c in rows["wim"].split("|")]
    lc = [c.strip() for c in rows["lc"].split("|")]
    assert wim[3:6] == ["4", "2", "3"] and wim[6].startswith("+0.25") and wim[7:9] == ["2", "1"]
    assert lc[3:6] == ["4", "1", "2"] and lc[6].startswith("+0.25") and lc[7:9] == ["1", "0"]
    # wim - lc: sentence 2 vs 1 (+0.25), lead 3 vs 2 (+0.25)
    gaps = [line for line in body.splitlines() if line.startswith("| t | sentence") or line.startswith("| t | lead")]
    assert [g.split("|")[4].strip()[:5] for g in gaps] == ["+0.25", "+0.25"]
    assert "t/0 (wim): gold 'Pier 47'" in body


def test_the_styles_must_be_two_known_ones(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ablation = load("answer_ablation")
    for bad in ("sentence", "sentence,sentence", "sentence,terse"):
        monkeypatch.setattr("sys.argv", ["answer_ablation.py", "x.toml", "--styles", bad])
        with pytest.raises(SystemExit):
            ablation.main()
        assert "--styles takes two different styles" in capsys.readouterr().err


def test_another_wim_option_is_checked_and_named_in_the_report(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ablation = load("answer_ablation")
    for argv, said in ((["--option", "kept_as", "--values", "written,bogus"], "'bogus' is no value of kept_as"),
                       (["--option", "kept_as", "--values", "written,written"], "two different values of kept_as"),
                       (["--option", "no_such", "--values", "a,b"], "'no_such' is no WiM option")):
        monkeypatch.setattr("sys.argv", ["answer_ablation.py", "x.toml", *argv])
        with pytest.raises(SystemExit):
            ablation.main()
        assert said in capsys.readouterr().err
    items = [_item(0, "Pier 47")]
    done = {("t/0", "wim"): {"answers": {"written": "No.", "sentence": "Pier 47."}, "seconds": 1.0, "commit": "a"},
            ("t/0", "lc"): {"answers": {"written": "No.", "sentence": "No."}, "seconds": 1.0, "commit": "a"}}
    body = ablation.report({"t": items}, done, ("written", "sentence"), "demo", "scripted", 0.0, "kept_as")
    assert body.startswith("## Two values of `kept_as`, paired") and "long context once" in body
    assert "| task | value | n | wim − lc (95% CI) |" in body
    wim = next(line for line in body.splitlines() if line.startswith("| t | wim"))
    assert [c.strip() for c in wim.split("|")][3:6] == ["1", "0", "1"]
