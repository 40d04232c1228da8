"""Prose training prompts of SmolLM2's speculators, in two rounds: the target writes articles,
blog posts and reports (``prose_prompts``, long reports: ``report_prompts``), then summarizes its
own articles (``digest_prompts``).

Why: the held-out default prompts include a travel blog post and a news summary, and
``harness.models.corpus`` has neither news-like prose nor a summary of it (its passages are
Python documentation). A summary copies names and phrases from its article; the head learns
that only from articles that read like news. Self-instruct from the target, so no third-party
text: the templates, places and events are this project's own, written for this file, and the
articles are the target's greedy answers (``harness.models.distill``'s "prose" sets). None is
a prompt the harness evaluates on (tests/test_distill.py checks).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from harness.models.corpus import TOPICS

PLACES = (
    "Lisbon", "Kyoto", "the Scottish Highlands", "Patagonia", "Iceland", "Morocco",
    "New Zealand", "Vienna", "the Amazon basin", "Cape Town", "Peru", "the Norwegian fjords",
    "Vietnam", "Istanbul", "Mexico City", "Prague", "Bali", "Kenya", "the Canadian Rockies",
    "Sicily", "Seoul", "Buenos Aires", "the Greek islands", "Jordan", "Alaska", "Quebec City",
    "Tasmania", "Rajasthan", "Copenhagen", "Edinburgh", "Marrakesh", "Cuba", "Tuscany",
    "the Swiss Alps", "Nepal", "Sri Lanka", "Chile's Atacama Desert", "Budapest", "Cairo",
    "Singapore", "Costa Rica", "a small fishing town", "a mountain village", "a river delta",
    "a coastal city", "a farming region", "a university town", "an island community",
)  # fmt: skip

EVENTS = (
    "a new bridge opening", "a record heat wave", "a flood that closed the main road",
    "a local school winning a national science prize", "a three-day music festival",
    "a factory closing after sixty years", "a rescue at sea", "a close city election",
    "a new hospital wing", "a wildfire near homes", "a court ruling on a land dispute",
    "the discovery of an ancient shipwreck", "a city marathon", "a strike by bus drivers",
    "a new train line", "a theft from the town museum", "a rare bird returning",
    "a charity fundraiser that broke its target", "a power cut lasting two days",
    "a storm that damaged hundreds of homes", "a new public library", "a food safety recall",
    "a drought and water limits", "a teenager's invention", "a zoo's newborn elephant",
    "a plan to ban cars from the old town", "a hospital's new cancer treatment",
    "a scandal over council spending", "a landslide that cut off a village",
    "a football club's surprise promotion", "an oil spill on the coast",
    "a protest against a new airport runway", "the reopening of a historic theatre",
)  # fmt: skip

PROSE_TEMPLATES = (
    "Write a news article reporting on {event} in {place}.",
    "Write a local newspaper story about {event}. Include quotes from people involved.",
    "Write a travel blog post about a week spent in {place}: the food, the people and the sights.",
    "Write a magazine feature about {t} in {place}.",
    "Write a press release announcing {event}.",
    "Write a review of a restaurant you visited in {place}.",
    "Write a short report for a town council about {t}.",
    "Write a diary entry about a day in {place}.",
    'Write an online article with the headline "What {place} can teach us about {t}".',
    "Write a news story about {event}, with what happened, who was affected and what comes next.",
)

DIGEST_TEMPLATES = (
    "Summarize: {text}",
    "Summarize the following article in a few sentences.\n\n{text}",
    "Write a one-paragraph summary of this text.\n\n{text}",
    "What are the main points of the article below?\n\n{text}",
    "Give a headline and a two-sentence summary for this article.\n\n{text}",
    "Summarize this for someone who has no time to read it.\n\n{text}",
)
MIN_ARTICLE_CHARS = 400  # an article shorter than this (a refusal, a list) is not summarized

# Long news reports (``report_prompts``, answered at up to distill's 640 tokens where the prose
# set stops at 256): a summary of one (``brief``) reads an article as long as the default
# workload's news summary reads, where a digest's article stops at 256 tokens.
REPORT_TEMPLATES = (
    "Write a long, detailed news report on {event} in {place}. Quote officials, witnesses and "
    "documents, give the background, and end with what happens next.",
    "Write a newspaper article of about 600 words on {event} in {place}, with the reactions of "
    "local people, a spokesperson's statement and figures from an official report.",
    "Write an in-depth news story about {event} in {place}: what happened, when it was first "
    "reported, who is responsible, what critics say and what the authorities promised.",
    "Write a full-length news article revealing new details about {event} in {place}, based on "
    "emails and records obtained by a reporter. Quote the people involved.",
    "Write a detailed online news article about {event} in {place}, with several paragraphs of "
    "quotes, a timeline of events and the latest figures.",
    "Write a long feature for a national newspaper about {event} in {place} and what it means "
    "for the families affected. Include interviews and expert comments.",
)


def distinct_prompts(kind: str, n: int, draw: Callable[[], str]) -> list[dict[str, Any]]:
    """``n`` distinct prompts from ``draw`` (id "KIND-NNNNN", category ``kind``), a repeat
    drawn again; fewer where 100 x ``n`` draws do not give ``n``."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(100 * n):
        if len(out) == n:
            break
        text = draw()
        if text not in seen:
            seen.add(text)
            out.append({"id": f"{kind}-{len(out):05d}", "category": kind, "prompt": text})
    return out


def prose_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct writing prompts (id "prose-NNNNN", category "prose"); seeded."""
    rng = random.Random(seed)

    def draw() -> str:
        return rng.choice(PROSE_TEMPLATES).format(
            event=rng.choice(EVENTS), place=rng.choice(PLACES), t=rng.choice(TOPICS)
        )

    return distinct_prompts("prose", n, draw)


def report_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct long-report prompts (id "report-NNNNN", category "report"); seeded."""
    rng = random.Random(seed)

    def draw() -> str:
        return rng.choice(REPORT_TEMPLATES).format(
            event=rng.choice(EVENTS), place=rng.choice(PLACES)
        )

    return distinct_prompts("report", n, draw)


def digest_prompts(
    articles: list[tuple[str, str]], seed: int = 0, kind: str = "digest"
) -> list[dict[str, Any]]:
    """A summary prompt per article (id, text) of at least MIN_ARTICLE_CHARS characters (id
    ``kind`` + "-" + the article's, category ``kind``: "digest" of prose, "brief" of reports);
    the template seeded per set."""
    rng = random.Random(seed)
    return [
        {
            "id": f"{kind}-{aid}",
            "category": kind,
            "prompt": rng.choice(DIGEST_TEMPLATES).format(text=text.strip()),
        }
        for aid, text in articles
        if len(text.strip()) >= MIN_ARTICLE_CHARS
    ]
