"""SmolLM2's speculator training data and its resumable training: the prompts are built here and
never the ones the harness evaluates on; an interrupted head training resumes to the weights an
uninterrupted one reaches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from harness.models import cli as models_cli
from harness.models import compose, corpus, distill, eagle3, eagle3_checkpoint, genres, prose
from harness.models import registry as models

DATA = Path(__file__).resolve().parents[1] / "workloads" / "data"


def test_prompts_are_seeded_distinct_and_spread_over_the_kinds() -> None:
    a, b = corpus.prompts(400, seed=0), corpus.prompts(400, seed=0)
    assert a == b and corpus.prompts(400, seed=1) != a
    assert len({r["prompt"] for r in a}) == len(a) == 400
    kinds = {r["category"] for r in a}
    assert kinds == {"open", "code", "passage", "math"}


def test_no_training_prompt_is_one_the_harness_evaluates_on() -> None:
    """Not a Spec-Bench turn, not a default or grounded workload prompt, not one of the
    grounded code edits' functions (the default workload draws there)."""
    from workloads.make_grounded import CODE_TASKS, function_source

    evaluated = set()
    for line in (DATA / "specbench_question.jsonl").read_text().splitlines():
        evaluated.update(json.loads(line)["turns"])
    for name in ("grounded.jsonl", "default.jsonl", "tiny.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            r = json.loads(line)
            evaluated.update([r["prompt"]] if "prompt" in r else [])
            evaluated.update(m["content"] for m in r.get("messages", []))
    sources = [function_source(m, f)[0] for _, m, f, _, _ in CODE_TASKS]
    built = [r for name in _own_sets() for r in distill.set_prompts(*distill.parse_set(name))]
    assert len(built) > 5000
    for r in built:
        assert r["prompt"] not in evaluated
        assert not any(src in r["prompt"] for src in sources), r["id"]


def test_a_digest_set_summarizes_its_prose_sets_articles() -> None:
    """Digest prompts wrap the target's own articles (never a text from outside), one per
    article long enough to summarize, ids tied to the article's; the template draw is seeded."""
    long_one = "The new bridge opened on Monday. " * 20
    articles = [("prose-00000", long_one), ("prose-00001", "Too short."), ("prose-00002", long_one)]
    rows = prose.digest_prompts(articles, seed=0)
    assert [r["id"] for r in rows] == ["digest-prose-00000", "digest-prose-00002"]
    assert all(long_one.strip() in r["prompt"] and r["category"] == "digest" for r in rows)
    assert rows == prose.digest_prompts(articles, seed=0)
    many = prose.digest_prompts([(str(i), long_one) for i in range(60)], seed=1)
    assert len({r["prompt"] for r in many}) == len(prose.DIGEST_TEMPLATES)  # all drawn
    with pytest.raises(FileNotFoundError, match="prose-7-3"):  # no articles, no digest
        distill.set_prompts("digest", 7, 3)
    briefs = prose.digest_prompts(articles, seed=0, kind="brief")
    assert [r["id"] for r in briefs] == ["brief-prose-00000", "brief-prose-00002"]
    assert {r["category"] for r in briefs} == {"brief"}
    with pytest.raises(FileNotFoundError, match="report-7-3"):  # a brief set summarizes reports
        distill.set_prompts("brief", 7, 3)


def test_report_prompts_are_seeded_distinct_and_answered_long() -> None:
    """Every report template is asked with its slots filled; a report is answered at up to
    LONG_ANSWERS' tokens (and its files say so), every other kind at ANSWER_TOKENS."""
    rows = prose.report_prompts(600, seed=0)
    assert rows == prose.report_prompts(600, seed=0) != prose.report_prompts(600, seed=1)
    assert len({r["prompt"] for r in rows}) == len(rows) == 600
    assert {r["category"] for r in rows} == {"report"} and rows[0]["id"] == "report-00000"
    assert not any("{" in r["prompt"] for r in rows)
    heads = {t.split("{", 1)[0] for t in prose.REPORT_TEMPLATES}
    assert heads == {h for h in heads if any(r["prompt"].startswith(h) for r in rows)}
    assert distill.answer_tokens("report") == 640 > distill.answer_tokens("brief") == 256
    assert distill.answers_path(0, 600, "report").name == "answers-report-0-600-640.jsonl"
    assert distill.feature_dir(0, 600, "brief").name == "features-brief-0-600-256"
    brief = distill.set_settings("brief-0-600")  # BUILD.json's: how its articles were written
    assert brief["answers"] == {"temperature": 0.0, "max_tokens": 256, "repetition_penalty": 1.0}
    assert brief["articles"] == {"set": "report-0-600", **distill.sampling("report")}
    assert distill.sampling("report")["repetition_penalty"] == 1.15


def test_genre_prompts_are_seeded_distinct_and_every_template_is_drawn() -> None:
    """Each of the genre set's templates is asked (its point is their spread), with every slot
    filled; the same seed gives the same prompts."""
    rows = genres.genre_prompts(2000, seed=0)
    assert rows == genres.genre_prompts(2000, seed=0) != genres.genre_prompts(2000, seed=1)
    assert len({r["prompt"] for r in rows}) == len(rows) == 2000
    assert [r["id"] for r in rows[:2]] == ["genre-00000", "genre-00001"]
    assert not any("{" in r["prompt"] for r in rows)
    heads = {t.split("{", 1)[0] for t in genres.GENRE_TEMPLATES + genres.WORD_PROBLEMS}
    drawn = {h for h in heads if any(r["prompt"].startswith(h) for r in rows)}
    assert drawn == heads


def test_compose_prompts_are_seeded_distinct_and_every_template_is_drawn() -> None:
    """Each compose template is asked, every slot filled (no brace left, no "your" where the
    template speaks as "I" or of "a"), and the same seed gives the same prompts."""
    rows = compose.compose_prompts(2000, seed=0)
    assert rows == compose.compose_prompts(2000, seed=0) != compose.compose_prompts(2000, seed=1)
    assert len({r["prompt"] for r in rows}) == len(rows) == 2000
    assert [r["id"] for r in rows[:2]] == ["compose-00000", "compose-00001"]
    assert {r["category"] for r in rows} == {"compose"}
    assert not any("{" in r["prompt"] or "}" in r["prompt"] for r in rows)
    assert not any("knew before your" in r["prompt"] for r in rows)
    heads = {t.split("{", 1)[0] for t in compose.COMPOSE_TEMPLATES}
    drawn = {h for h in heads if any(r["prompt"].startswith(h) for r in rows)}
    assert drawn == heads


def _own_sets() -> list[str]:
    """The training sets whose prompts are built without the target: a summarizing set (digest,
    brief) stands for the set whose articles it summarizes (prose, report)."""
    names = []
    for name in distill.SETS + distill.OTHER_SETS:
        kind, seed, n = distill.parse_set(name)
        name = f"{distill.SUMMARIZES.get(kind, kind)}-{seed}-{n}"
        names += [] if name in names else [name]
    return names


def test_the_training_sets_are_disjoint_and_the_long_ones_long() -> None:
    """A later seed's mixed set drops the earlier seeds' prompts (else it would repeat a third
        of them); ids are unique across sets; the long set's passages are 1,500-3,600 characters of
    whole paragraphs (or one longer paragraph)."""
    seen: dict[str, str] = {}
    ids: set[str] = set()
    for name in _own_sets():
        rows = distill.set_prompts(*distill.parse_set(name))
        for r in rows:
            assert r["prompt"] not in seen, (name, seen.get(r["prompt"]))
            seen[r["prompt"]] = name
        assert not ids & {r["id"] for r in rows}
        ids |= {r["id"] for r in rows}
    again = distill.set_prompts("mixed", 1, 2500)
    assert again == distill.set_prompts("mixed", 1, 2500)  # seeded
    assert len(again) < len(corpus.prompts(2500, seed=1))  # the overlap with seed 0 went
    long = distill.set_prompts("long", 0, 10_000)
    assert len(long) > 400
    for r in long:
        text = r["prompt"].split("\n\n", 1)[1]
        assert len(text) >= corpus.LONG_MIN_CHARS
        assert len(text) <= corpus.LONG_MAX_CHARS or "\n\n" not in text  # or one paragraph


@pytest.mark.parametrize("bad", ["mixed-1", "short-0-10", "mixed-x-10", "mixed-1-2-3"])
def test_a_bad_training_set_name_is_one_line_and_exit_2(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert models_cli.main(["build", "--train", "--sets", f"mixed-0-3000,{bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sets" in err[0] and repr(bad) in err[0], err
    with pytest.raises(SystemExit) as done:  # the developer command the same way
        distill.main(["answers", "mixed-0-3000", bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and repr(bad) in err[0], err


def _tiny_data() -> tuple[Any, list[dict[str, Any]], Any, tuple[int, ...]]:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import tiny_eagle3
    from harness.models.data import draft_vocab

    model = AutoModelForCausalLM.from_pretrained(models.tiny_path("target"), dtype=torch.float32)
    model.eval()
    cfg = model.config.to_dict()
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(3, cfg["vocab_size"], (10, tiny_eagle3.PROMPT_LEN), generator=gen)
    data = tiny_eagle3.sequences(model, x, layers)
    return model, data, draft_vocab(data, 512, cfg["vocab_size"]), layers


@pytest.mark.usefixtures("tiny_pair")
def test_an_interrupted_head_training_resumes_to_the_same_weights(tmp_path: Path) -> None:
    import torch

    from harness.models import optim

    model, data, vocab, layers = _tiny_data()
    torch.set_num_threads(1)
    whole, _ = eagle3.train(model, data, vocab, 0, 0.0, steps=7, layers=layers)
    ckpt = tmp_path / "head.ckpt"
    real, calls = optim.optimizer_step, []

    def dies_after_five(*args: Any) -> None:
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        real(*args)

    with (
        mock.patch.object(optim, "optimizer_step", dies_after_five),
        pytest.raises(KeyboardInterrupt),
    ):
        eagle3.train(model, data, vocab, 0, 0.0, steps=7, layers=layers, checkpoint=ckpt, every=2)
    assert torch.load(ckpt)["step"] == 4  # the last checkpoint before the interruption
    resumed, info = eagle3.train(
        model, data, vocab, 0, 0.0, steps=7, layers=layers, checkpoint=ckpt, every=2
    )
    assert info["steps"] == 7
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.usefixtures("tiny_pair")
def test_more_passes_start_from_the_saved_head(tmp_path: Path) -> None:
    """``models build --train --more``: the head starts from the saved weights (its trained
    lm_head too), not from the target's last layer; a file of another vocabulary is refused."""
    import torch

    model, data, vocab, layers = _tiny_data()
    torch.set_num_threads(1)
    first, _ = eagle3.train(model, data, vocab, 0, 0.0, steps=5, layers=layers, train_lm_head=True)
    eagle3_checkpoint.save(
        first,
        vocab,
        tmp_path,
        eagle3_checkpoint.head_config(model.config.to_dict(), len(vocab), layers),
    )
    saved = tmp_path / "eagle3.safetensors"
    cfg = eagle3_checkpoint.head_config(model.config.to_dict(), len(vocab), layers)
    emb = model.model.embed_tokens.weight.detach()
    again = eagle3.Eagle3Head(cfg, emb, vocab, train_lm_head=True)
    eagle3_checkpoint.load_into(again, saved, vocab)
    half = {k: v.half().float() for k, v in first.state_dict().items()}  # saved as fp16
    assert not torch.equal(half["lm_head"], emb[vocab].half().float())  # it trained
    assert all(torch.equal(half[k], v) for k, v in again.state_dict().items())
    more, info = eagle3.train(
        model,
        data,
        vocab,
        0,
        0.0,
        steps=1,
        layers=layers,
        train_lm_head=True,
        init=saved,
        peak_lr=1e-9,
    )  # one step at a negligible rate: still (about) the saved head
    assert torch.allclose(more.fc.weight, half["fc.weight"], atol=1e-6)
    assert info["lm_head"] == "trained"
    frozen = eagle3.Eagle3Head(cfg, emb, vocab)  # a trained lm_head cannot be dropped
    with pytest.raises(ValueError, match="trained lm_head"):
        eagle3_checkpoint.load_into(frozen, saved, vocab)
    with pytest.raises(ValueError, match="vocabulary"):
        eagle3_checkpoint.load_into(again, saved, vocab[:-1])


def test_alpha_at_k1_counts_drafts_as_vllm_does() -> None:
    """vLLM's alpha at K 1 drafts after every target pass: an accepted draft's pass also gives
    the next token, so the position after a hit is never drafted (known truths)."""
    from harness.models.evaluate import drafts_at_k1

    assert drafts_at_k1([True] * 6) == (3, 3)
    assert drafts_at_k1([False] * 6) == (0, 6)
    assert drafts_at_k1([True, False] * 4) == (4, 4)  # agreement 0.5, alpha 1
    assert drafts_at_k1([False, True] * 4) == (4, 5)
    assert drafts_at_k1([True, True, False, False, True]) == (2, 4)
    assert drafts_at_k1([]) == (0, 0)


@pytest.mark.usefixtures("tiny_pair")
def test_answers_come_from_vllm_in_a_child_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answers stage, end to end on the tiny target: vLLM answers in a spawned child (its
    arguments pickle, the environment passes), one JSONL row per prompt, and a second call finds
    them done. (Why a child: in a 1,598-prompt build a second engine in one process died
    "cancelled" after the first was deleted; the tiny pair does not reproduce that.)"""
    monkeypatch.setattr(distill, "WORK", tmp_path)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")

    def three(kind: str, seed: int, n: int, target: Path | None = None) -> list[dict[str, Any]]:
        return [
            {"id": f"{kind}-{i}", "category": kind, "prompt": f"Count to {i + 2}."}
            for i in range(n)
        ]

    monkeypatch.setattr(distill, "set_prompts", three)
    target = models.tiny_path("target")
    path = distill.generate_answers(target, 0, 3, progress=False, kind="long")
    rows = distill.load_answers(path)
    assert path.parent == tmp_path and [r["id"] for r in rows] == [f"long-{i}" for i in range(3)]
    assert all(r["output_ids"] and r["prompt_ids"] for r in rows)
    assert distill.generate_answers(target, 0, 3, progress=False, kind="long") == path  # done
    assert len(distill.load_answers(path)) == 3


@pytest.mark.usefixtures("tiny_pair")
@pytest.mark.parametrize("kind", ["digest", "brief"])
def test_a_summarizing_sets_answers_summarize_its_source_sets_answers(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for a digest (brief) set, the answers stage first answers its prose (report) set,
    vLLM on the tiny target, at that set's answer length, then prompts with those answers
    decoded: each summary prompt holds its article."""
    from transformers import AutoTokenizer

    monkeypatch.setattr(distill, "WORK", tmp_path)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setattr(prose, "MIN_ARTICLE_CHARS", 1)  # the tiny target writes little
    monkeypatch.setattr(distill, "LONG_ANSWERS", {"report": 6})  # shorter than it writes
    target = models.tiny_path("target")
    source = distill.SUMMARIZES[kind]
    path = distill.generate_answers(target, 0, 3, progress=False, kind=kind)
    articles = distill.load_answers(distill.answers_path(0, 3, source))
    longest = max(len(a["output_ids"]) for a in articles)
    assert (longest == 6) if kind == "brief" else (6 < longest <= distill.ANSWER_TOKENS)
    digests = {r["id"]: r for r in distill.load_answers(path)}
    assert len(articles) == 3 and digests
    tok = AutoTokenizer.from_pretrained(target)
    for a in articles:
        text = tok.decode(a["output_ids"], skip_special_tokens=True).strip()
        if text:
            asked = tok.decode(digests[f"{kind}-{a['id']}"]["prompt_ids"])
            assert text in asked


@pytest.mark.usefixtures("tiny_pair")
def test_features_never_mix_shards_cut_from_other_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shards are numbered by batch: features made while the answers were partial, then again
    after they grew, would hold some sequences twice and others never; they are remade."""
    import torch

    from harness.models import smollm

    monkeypatch.setattr(distill, "WORK", tmp_path)
    monkeypatch.setattr(distill, "FEATURE_TOKENS", 24)  # a few sequences per shard
    monkeypatch.setattr(smollm, "EAGLE3_LAYERS", (1, 2, 3))  # the tiny target's 4 layers
    target = models.tiny_path("target")
    path = distill.answers_path(0, 6)
    rows = [
        {"id": f"r{i}", "category": "open", "prompt_ids": [5 + i] * (8 - i), "output_ids": [9] * 4}
        for i in range(6)
    ]
    # an interrupted answers run, then resumed to the end: the rows it adds are the shortest,
    # so they sort first and every batch boundary moves
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    distill.make_features(target, 0, 6, threads=1, progress=False)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    distill.make_features(target, 0, 6, threads=1, progress=False)
    got = [s["id"] for s in distill.load_features(0, 6)]
    assert sorted(got) == [f"r{i}" for i in range(6)]
    for s in distill.load_features(0, 6):
        assert torch.equal(
            s["ids"][: s["prompt_len"]], torch.tensor(rows[int(s["id"][1:])]["prompt_ids"])
        )


def test_one_writer_per_set_and_answers_once_per_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second build writing the same set waits for the first, saying so in one line (two at
    once appended every answer twice), then goes on; a file that holds an answer twice still
    loads it once, the first."""
    import fcntl
    import threading

    monkeypatch.setattr(distill, "WORK", tmp_path)
    path = distill.answers_path(1, 10)
    rows = [{"id": "a", "output_ids": [1]}, {"id": "b", "output_ids": [2]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"id": "a", "output_ids": [3]}]))
    assert distill.load_answers(path) == rows
    ran: list[str] = []
    monkeypatch.setattr(distill, "_make_features", lambda *a: ran.append("features"))
    feats = str(distill.feature_dir(1, 10)) + ".lock"
    with open(feats, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the first build, writing the set's features
        second = threading.Thread(
            target=distill.make_features, args=(tmp_path / "no-model-needed", 1, 10), daemon=True
        )
        second.start()
        second.join(0.5)
        assert second.is_alive() and ran == []  # waiting: it neither failed nor wrote
    second.join(60)  # the first one done (its lock gone): the second goes on
    assert not second.is_alive() and ran == ["features"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another process is writing" in err[0] and "features-1-10" in err[0]


def test_the_draft_trains_on_the_threads_train_all_set() -> None:
    """train_all sets --threads once; the draft's steps used to cap torch back to one thread."""
    import torch

    from harness.models import train

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        train._torch()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_build_json_says_when_each_speculator_was_made() -> None:
    """BUILD.json's made_on: the build's own line, on every speculator it trained; one it
    kept keeps the line of the build that made it (a hand edit put them back before)."""
    from harness.models import train

    line = train.made_on(0.0, 3600.0 * 1.5, "python -m harness models build --train")
    assert line.startswith("1970-01-01 00:00-01:30 UTC on ")
    assert line.endswith("`python -m harness models build --train`")
    assert train.made_on(0.0, 86400.0 + 60, "x").startswith("1970-01-01 00:00-1970-01-02 00:01 UTC")
    head = {"steps": 10}
    draft = {"steps": 5, "made_on": "the old draft's line", "kept": "the committed draft"}
    older = {"steps": 3, "kept": "the committed head"}  # a BUILD.json from before the lines
    train.stamp((head, draft, older), line, "the old build's line")
    assert head["made_on"] == line
    assert draft["made_on"] == "the old draft's line"
    assert older["made_on"] == "the old build's line"
    assert "held_out_first_position_agreement" in train.METRIC


def test_a_further_stage_keeps_each_earlier_stages_data() -> None:
    """``--more``: the committed head becomes the last of ``eagle3.earlier_stages`` with the
    ``data`` it trained on, since the new BUILD.json's ``data`` names only the new stage's sets
    (each stage's provenance was lost to the next)."""
    from harness.models import train

    first = {"steps": 1, "data": {"sets": {"mixed-0-3000": {}}}}
    second = {"steps": 2}
    old = {"data": {"sets": {"prose-0-600": {}}}, "eagle3": {**second, "earlier_stages": [first]}}
    stages = train.earlier_stages(old)
    assert stages == [first, {"steps": 2, "data": {"sets": {"prose-0-600": {}}}}]
    assert "earlier_stages" in old["eagle3"]  # the record read is left as it was
    assert train.earlier_stages({}) == [{}]


def test_an_interrupted_answers_file_resumes_after_its_whole_lines(tmp_path: Path) -> None:
    """A run killed mid-write leaves a torn last line: it is dropped, so the next answers
    append after whole lines (appending after it made one unreadable line of two)."""
    path = tmp_path / "answers.jsonl"
    rows = [{"id": "a", "output_ids": [1]}, {"id": "b", "output_ids": [2]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "c", "outp')
    assert distill._done_ids(path) == {"a", "b"}
    with path.open("a") as f:
        f.write(json.dumps({"id": "c", "output_ids": [3]}) + "\n")
    assert [r["id"] for r in distill.load_answers(path)] == ["a", "b", "c"]
    assert distill._done_ids(tmp_path / "none.jsonl") == set()
