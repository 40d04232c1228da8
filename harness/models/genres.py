"""Genre training prompts of SmolLM2's speculators: many more kinds of request than
``harness.models.corpus`` and ``harness.models.prose`` ask, in the phrasings users write.

Why: trained on those two, the head agrees with the target on 0.71 of the first draft positions
of their own validation prompts but on 0.37 of the held-out Spec-Bench ones, and a second pass
over them added nothing (docs/measurements.md): it learned what their templates' answers look
like. The target answers a letter, a speech, a recipe, a product page, a dialogue, a lesson
plan, a multi-step word problem, a riddle or a history question each in its own register, and
the head meets those registers only if it trains on them. Every template, role, name and item
here was written for this file (no third-party text); the answers are the target's own
(``harness.models.distill``'s "genre" sets), and none is a prompt the harness evaluates on
(tests/test_distill.py checks).
"""

from __future__ import annotations

import random
from typing import Any

from harness.models.corpus import TOPICS
from harness.models.prose import EVENTS, PLACES, distinct_prompts

ROLES = (
    "a nurse", "a high school teacher", "a software engineer", "a farmer", "a chef",
    "a firefighter", "a librarian", "a pilot", "a museum guide", "a small business owner",
    "a marine biologist", "a bus driver", "a retired soldier", "a university student",
    "a city mayor", "a football coach", "a bakery owner", "a journalist", "a park ranger",
    "an astronaut", "an architect", "a detective", "a musician", "a fitness trainer",
    "a pharmacist", "a new parent", "a hotel manager", "a carpenter", "a scientist",
    "a shop assistant", "a tour guide", "a painter", "a lawyer", "a dentist", "a poet",
)  # fmt: skip

NAMES = (
    "Maria", "James", "Aisha", "Kenji", "Olivia", "Carlos", "Fatima", "Liam", "Priya", "Noah",
    "Elena", "Samuel", "Mei", "Daniel", "Zara", "Lucas", "Hannah", "Omar", "Sofia", "Ben",
    "Grace", "Ivan", "Leila", "Tom", "Nadia", "Pedro", "Chloe", "Ravi", "Emma", "Kwame",
)  # fmt: skip

ITEMS = (
    "a reusable water bottle", "a pair of running shoes", "a solar-powered phone charger",
    "a smart watch", "an electric kettle", "a hiking backpack", "a noise-cancelling headset",
    "a board game for families", "a cookbook for beginners", "a desk lamp", "a mountain bike",
    "a coffee grinder", "a language learning app", "a handmade wooden chair", "a winter jacket",
    "a robot vacuum cleaner", "a children's picture book", "a yoga mat", "a camping tent",
    "an online course about budgeting", "a houseplant delivery service", "a city bike rental",
)  # fmt: skip

GENRE_TEMPLATES = (
    # writing: letters, speeches, posts, pages
    "Write a formal letter from {role} to the city council about {t}.",
    "Draft a professional email to your manager asking for a day off next week to attend {event}.",
    "Compose a heartfelt thank-you note to {role} who helped you during a difficult time.",
    "Write a speech that {role} might give at a graduation ceremony about {t}.",
    "Write a short wedding toast for your best friend {name}.",
    "Create a product description for {item} for an online shop.",
    "Write a customer review of {item}, mentioning what you liked and what could be better.",
    "Write an advertisement for {item} aimed at young families.",
    "Write a social media post announcing {event} in {place}.",
    "Compose an engaging blog post about {t}, with a catchy title and three sections.",
    "Write a cover letter for {name}, who is applying for a job as {role}.",
    "Write the opening paragraph of a mystery novel set in {place}.",
    "Write a children's bedtime story about {t}.",
    "Write a fable with a moral about {t}, with animals as the characters.",
    "Describe a vivid and unique character: {role} who lives in {place}.",
    "Write a dialogue between {role} and a curious child about {t}.",
    "Write an interview with {role} about their daily work.",
    "Write a limerick about {t}.",
    "Write song lyrics about {t} with a chorus.",
    "Write a motivational message for someone who is nervous about {t}.",
    "Write an opinion piece arguing for or against {t}.",
    "Write a short horror story that takes place in {place}.",
    "Write a letter to your future self about {t}.",
    "Write a complaint letter to a company about {item} that broke after one week.",
    "Write an FAQ page with five questions and answers about {t}.",
    "Write a newsletter for the members of a local club about {event}.",
    "Plan a three-day itinerary for a family visiting {place}.",
    "Write a recipe for a simple dish from {place}, with ingredients and steps.",
    "Write a lesson plan for a one-hour class about {t} for twelve-year-olds.",
    "Write a description of {place} for a travel guide book.",
    # roleplay
    "Pretend you are {role}. Describe a typical morning at work.",
    "Act as {role} and give advice to someone who wants to learn about {t}.",
    "You are a travel agent. Convince a customer to book a holiday in {place}.",
    "Imagine you are a famous explorer who has just returned from {place}. Tell us about it.",
    "Role-play as a museum curator introducing an exhibition about {t}.",
    # knowledge: stem, humanities, qa
    "How does {t} work? Explain it simply.",
    "What is the history of {t}? Give the key moments.",
    "What are the most common questions people have about {t}? Answer each briefly.",
    "Explain the science behind {t}.",
    "What would happen if {t} disappeared from the world tomorrow?",
    "What are three myths about {t}, and what is the truth?",
    "How has {t} changed over the last hundred years?",
    "What should a beginner know before trying {t}?",
    "Describe the culture and traditions of {place}.",
    "What are the main challenges facing {place} today?",
    "Why do people visit {place}? List the main reasons.",
    "What does {role} need to know about {t}?",
    "Explain the difference between {t} and {u} in a table.",
    "Give a step-by-step guide to {t} for a complete beginner.",
    "What are the pros and cons of working as {role}?",
    # reasoning and riddles
    "Answer this riddle and explain your reasoning: what has keys but cannot open locks?",
    "{name} is taller than {other}, and {other} is taller than {third}. Who is the shortest? "
    "Explain.",
    "If all the {role_plain}s in a town are early risers and {name} is one of them, what can we "
    "say about {name}? Explain your reasoning.",
    "{name}, {other} and {third} each have a different favourite season: summer, winter or "
    "spring. {name} does not like the cold and {other} likes flowers. Who likes which season?",
)

WORD_PROBLEMS = (
    "{name} buys {a} notebooks at ${b} each and {c} pens at $2 each. How much does {name} spend "
    "in total?",
    "{name} earns ${a} per hour and works {b} hours a week. After {c} weeks, how much has "
    "{name} earned?",
    "A farmer has {a} chickens. Each chicken lays {b} eggs a week. The farmer sells the eggs in "
    "boxes of 6 for ${c} a box. How much money does the farmer make in a week?",
    "{name} reads {a} pages a day. The book has {b}0 pages. How many days will it take to finish "
    "the book?",
    "A school trip costs ${a} per student. There are {b} students and the school pays {c}% of the "
    "cost. How much do the students pay in total?",
    "{name} has ${a}0. {name} spends a quarter of it on a gift and ${b} on lunch. How much money "
    "is left?",
    "A baker makes {a} loaves of bread every morning. She sells {b} of them at ${c} each and "
    "gives the rest away. How much money does she make, and how many does she give away?",
    "{name} runs {a} kilometers on Monday, twice as far on Tuesday and {b} kilometers on "
    "Wednesday. How far does {name} run in the three days?",
    "A tank holds {a}0 liters of water. It leaks {b} liters per hour. How many hours until it "
    "is half empty?",
    "There are {a} people at a party. Each pizza feeds {b} people and costs ${c}. How much do "
    "the pizzas cost?",
    "{name} is {a} years old. {other} is {b} years older than {name}, and their mother is twice "
    "{other}'s age. How old is their mother?",
    "A shirt costs ${a}0. It is on sale for {b}% off. {name} buys {c} shirts. How much does "
    "{name} pay?",
    "{name} saves ${a} every week. {other} saves ${b} every week but started with ${c}0. After "
    "how many weeks have they saved the same amount, if ever?",
    "A train leaves at 9:{a:02d} and the trip takes {b} hours and {c} minutes. When does it "
    "arrive?",
    "A garden is {a} meters long and {b} meters wide. Fencing costs ${c} per meter. How much "
    "does it cost to fence the whole garden?",
)


def genre_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct genre prompts (id "genre-NNNNN", category "genre"): four in five from
    GENRE_TEMPLATES, one in five a multi-step word problem; seeded."""
    rng = random.Random(seed)

    def draw() -> str:
        name, other, third = rng.sample(NAMES, 3)
        t, u = rng.sample(TOPICS, 2)
        role = rng.choice(ROLES)
        slots = {
            "t": t, "u": u, "role": role, "role_plain": role.split(" ", 1)[1],
            "name": name, "other": other, "third": third, "item": rng.choice(ITEMS),
            "place": rng.choice(PLACES), "event": rng.choice(EVENTS),
            "a": rng.randint(2, 59), "b": rng.randint(2, 30), "c": rng.randint(2, 25),
        }  # fmt: skip
        table = WORD_PROBLEMS if rng.random() < 0.2 else GENRE_TEMPLATES
        return rng.choice(table).format(**slots)

    return distinct_prompts("genre", n, draw)
