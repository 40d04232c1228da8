"""Compose training prompts of SmolLM2's speculators: long-form writing asked the way people ask
a chat model, with an audience, a tone, a length or a point of view, many in the first person.

Why: after the corpus, prose and genre sets the head drafted open writing worst of the default
workload's prompts (its travel blog post; figures in docs/measurements.md). The target opens
such answers in its own stock phrases ("As I stepped off ...", "In today's fast-paced world
...") and keeps a register per request: a personal account, an explainer for children, a
persuasive pitch, a story that must start with a given sentence. None of the earlier templates
asks for a point of view or a constraint, so the head met few of those openings. Every template,
experience, audience and opening sentence here was written for this file (no third-party text);
the answers are the target's own (``harness.models.distill``'s "compose" sets), and none is a
prompt the harness evaluates on (tests/test_distill.py checks).
"""

from __future__ import annotations

import random
from typing import Any

from harness.models.corpus import TOPICS
from harness.models.genres import ITEMS, NAMES, ROLES
from harness.models.prose import EVENTS, PLACES, distinct_prompts

EXPERIENCES = (
    "your first week living in {place}", "learning to cook at fifty", "running your first "
    "marathon", "a weekend without your phone", "volunteering at an animal shelter",
    "moving back in with your parents", "starting a vegetable garden on a balcony",
    "a night train across {place}", "getting lost in {place}", "your first job interview",
    "teaching your grandmother to use a smartphone", "a camping trip that went wrong",
    "learning to swim as an adult", "a cooking class in {place}", "quitting sugar for a month",
    "building a bookshelf from scratch", "a family reunion after ten years",
    "your first day as {role}", "a road trip with three friends", "adopting a rescue dog",
    "a silent retreat in {place}", "living on a tight budget for a month",
    "a language exchange in {place}", "watching {event}", "working from a cafe in {place}",
)  # fmt: skip

AUDIENCES = (
    "ten-year-olds", "busy parents", "first-year university students", "retired people",
    "small business owners", "people who have never heard of it", "a skeptical reader",
    "new employees", "teenagers", "tourists", "experts who want the details",
)  # fmt: skip

TONES = ("humorous", "formal", "warm and personal", "enthusiastic", "calm and reassuring",
         "persuasive", "nostalgic", "matter-of-fact")  # fmt: skip

OPENINGS = (
    "The lights went out just as the last guest arrived.",
    "Nobody in the village had seen a stranger in years.",
    "The letter had been sitting in the drawer for forty years.",
    "On the morning of the storm, the harbour was strangely quiet.",
    "She had exactly one hour to find the key.",
    "The robot had never been outside the factory before.",
    "When the old clock stopped, everyone in the house held their breath.",
    "It was the kind of summer nobody forgets.",
    "The map showed a river where there had never been one.",
    "He opened the door and found his own face looking back at him.",
)

COMPOSE_TEMPLATES = (
    # first-person accounts
    "Write a personal blog post about {exp}. Share what surprised you and what you would do "
    "differently.",
    "Write a first-person essay about {exp} and what it taught you.",
    "Tell the story of {exp} in a {tone} tone, as if writing to a close friend.",
    "Write a reflective journal entry about {exp}.",
    "Write a short memoir piece about {exp}, with vivid details.",
    "Write an Instagram caption and a short post about {exp}.",
    "Write a travel diary entry about an unexpected day in {place}, describing the people you "
    "met and the food you tried.",
    "Describe your favourite place in {place} as if you were showing it to a visitor.",
    # constrained writing
    "Write a {tone} article about {t} for {aud}, in no more than five paragraphs.",
    "Explain {t} to {aud}. Use an everyday example.",
    "Write a {tone} speech for {role} opening {event}.",
    "Write a short persuasive essay convincing {aud} to care about {t}.",
    'Write a blog post titled "Five things I wish I knew before {exp_mine}".',
    "Write a newsletter introduction for {aud} about {t}, in a {tone} tone.",
    "Write a product launch announcement for {item}, aimed at {aud}.",
    "Write a compelling pitch for {item} in under 150 words.",
    "Draft an email from {name} to a neighbour inviting them to {event}.",
    "Write a {tone} letter from {name} to an old teacher, thanking them for an interest in {t}.",
    "Write a column for a local paper giving advice to {aud} about {t}.",
    "Write a podcast introduction for an episode about {t}, for {aud}.",
    "Write a short guide to {place} for {aud}, with where to eat, what to see and what to avoid.",
    "Compare living in {place} with living in {place2} for {aud}.",
    "Write an encouraging note to {aud} who are about to start {exp_plain}.",
    "Write an announcement for the staff of a hospital about {event}.",
    # stories
    'Write a short story that begins with the sentence: "{opening}"',
    'Continue this story in about 200 words: "{opening}"',
    "Write a short story about {name}, {role}, who discovers something strange about {t}.",
    "Write a story for children in which {name} learns about {t} during a trip to {place}.",
    "Write a scene in which {name} and {other} argue about {t}, then make peace.",
    "Write a {tone} short story set during {event} in {place}.",
    "Describe a bustling market in {place} using all five senses.",
    "Write a poem about {exp_plain}.",
    # explanation and opinion
    "Share your thoughts on whether {t} will matter more or less in twenty years.",
    "What advice would you give to someone facing {exp_plain}?",
    "Discuss the impact of {t} on daily life in {place}.",
    "Write a balanced article about the benefits and drawbacks of {t}.",
    "Describe how {role} might spend a day dealing with {event}.",
    "Write a short profile of {name}, {role} from {place}, for a community magazine.",
)


def compose_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct compose prompts (id "compose-NNNNN", category "compose"); seeded."""
    rng = random.Random(seed)

    def draw() -> str:
        place, place2 = rng.sample(PLACES, 2)
        name, other = rng.sample(NAMES, 2)
        role, event = rng.choice(ROLES), rng.choice(EVENTS)
        exp = rng.choice(EXPERIENCES).format(place=place, role=role, event=event)
        slots = {
            "exp": exp, "exp_plain": exp.replace("your ", "a ", 1), "exp_mine": exp.replace("your ", "my "), "t": rng.choice(TOPICS),
            "place": place, "place2": place2, "name": name, "other": other, "role": role,
            "event": event, "item": rng.choice(ITEMS), "aud": rng.choice(AUDIENCES),
            "tone": rng.choice(TONES), "opening": rng.choice(OPENINGS),
        }  # fmt: skip
        return rng.choice(COMPOSE_TEMPLATES).format(**slots)

    return distinct_prompts("compose", n, draw)
