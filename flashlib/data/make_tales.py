"""Write tales.txt: short English-like stories from a small probabilistic grammar.

The course trains a small character-level GPT on a text that ships with flashlib.
No public text could be fetched where the course was written, so the text is
generated, deterministically (a fixed seed, Python's ``random.Random``, which
gives the same sequence on every platform): it is ours, free of any licence
question, and regenerating it gives the same bytes (a test checks that).

Run from anywhere: ``python flashlib/data/make_tales.py`` rewrites tales.txt
beside this file.
"""
from __future__ import annotations

import random
from pathlib import Path

SEED = 2024
TARGET_BYTES = 200_000

NAMES = ["Mara", "Tom", "Lina", "Bo", "Ada", "Finn", "Nell", "Otto", "Ivy", "Sam", "Ruth", "Kit"]
ANIMALS = ["fox", "cat", "owl", "bear", "mouse", "dog", "hen", "frog", "goat", "crow"]
ADJECTIVES = ["little", "old", "small", "brave", "quiet", "happy", "tired", "clever", "shy", "kind"]
COLOURS = ["red", "blue", "green", "yellow", "brown", "white", "black", "grey"]
THINGS = ["ball", "hat", "box", "key", "cake", "boat", "kite", "lamp", "book", "cup", "shoe", "drum"]
PLACES = ["the garden", "the forest", "the river", "the market", "the hill", "the barn",
          "the kitchen", "the park", "the old mill", "the beach", "the village", "the field"]
TIMES = ["One morning", "One day", "Late at night", "After lunch", "In the spring",
         "On a cold day", "At sunset", "Early in the morning", "One rainy evening"]
FEELINGS = ["happy", "sad", "surprised", "tired", "hungry", "glad", "worried", "proud"]
FOUND_VERBS = ["found", "lost", "saw", "wanted", "carried", "painted", "hid", "dropped"]
MOVE_VERBS = ["walked", "ran", "went", "hurried", "climbed", "wandered"]
SAYINGS = ["Let us go home", "I can help you", "Look at this", "Where is my {thing}?",
           "This is a fine {thing}", "Come with me", "I am {feeling} today", "Thank you, friend"]
ENDINGS = ["And that was the end of the day.", "Then everyone went to sleep.",
           "It was a good day after all.", "The next day they did it all again.",
           "And they were friends from then on."]


class Tale:
    """One story: a hero, a friend, a thing, told in a few sentences."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.hero = rng.choice(NAMES)
        self.friend = f"the {rng.choice(ADJECTIVES)} {rng.choice(ANIMALS)}"
        self.thing = f"{rng.choice(COLOURS)} {rng.choice(THINGS)}"

    def pick(self, options):
        return self.rng.choice(options)

    def opening(self) -> str:
        return f"{self.pick(TIMES)}, {self.hero} {self.pick(MOVE_VERBS)} to {self.pick(PLACES)}."

    def event(self) -> str:
        rng = self.rng
        kind = rng.random()
        if kind < 0.25:
            return f"There {self.hero} {self.pick(FOUND_VERBS)} a {self.thing}."
        if kind < 0.45:
            return f"{self.hero} met {self.friend} near {self.pick(PLACES)}."
        if kind < 0.6:
            words = self.pick(SAYINGS).format(thing=self.thing.split()[-1], feeling=self.pick(FEELINGS))
            speaker = self.hero if rng.random() < 0.5 else self.friend
            return f"\"{words}{'' if words.endswith('?') else ','}\" said {speaker}."
        if kind < 0.75:
            return f"{self.friend.capitalize()} was {self.pick(FEELINGS)} because the {self.thing} was gone."
        if kind < 0.9:
            return (f"They {self.pick(MOVE_VERBS)} to {self.pick(PLACES)} and "
                    f"{self.pick(FOUND_VERBS)} a {self.pick(COLOURS)} {self.pick(THINGS)}.")
        return f"{self.hero} felt {self.pick(FEELINGS)}."

    def tell(self) -> str:
        sentences = [self.opening()] + [self.event() for _ in range(self.rng.randint(2, 5))]
        sentences.append(self.pick(ENDINGS))
        return " ".join(sentences)


def make_text(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """Stories, one paragraph each, until the text reaches ``target_bytes``."""
    rng = random.Random(seed)
    tales, size = [], 0
    while size < target_bytes:
        tale = Tale(rng).tell()
        tales.append(tale)
        size += len(tale) + 2
    return "\n\n".join(tales) + "\n"


if __name__ == "__main__":
    path = Path(__file__).with_name("tales.txt")
    path.write_text(make_text(), encoding="utf-8")
    print(f"wrote {path.name}: {path.stat().st_size} bytes")
