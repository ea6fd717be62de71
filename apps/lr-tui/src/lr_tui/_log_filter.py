"""The log view's filter: which lines of a combined log to show.

`LogFilter.parse("nccl rank:1 events")` keeps the lines that contain every plain word
(case-insensitive), come from one of the `rank:N[,M]` ranks (their `[rankN]:` prefix), and,
with `events`, only the lines an event was found on. An empty filter keeps every line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._events import split_prefix

__all__ = ["LogFilter"]


@dataclass(frozen=True)
class LogFilter:
    words: tuple[str, ...] = ()
    ranks: frozenset[int] = frozenset()
    events_only: bool = False
    problem: str = ""
    """What could not be understood (the filter then ignores that word)."""

    @classmethod
    def parse(cls, text: str) -> LogFilter:
        words: list[str] = []
        ranks: set[int] = set()
        events_only = False
        problem = ""
        for token in text.split():
            lower = token.lower()
            if lower == "events":
                events_only = True
            elif lower.startswith("rank:"):
                try:
                    ranks.update(int(r) for r in lower[5:].split(",") if r)
                except ValueError:
                    problem = f"{token}: expected rank:N or rank:N,M"
            else:
                words.append(lower)
        return cls(tuple(words), frozenset(ranks), events_only, problem)

    @property
    def empty(self) -> bool:
        return not (self.words or self.ranks or self.events_only)

    def matches(self, line: str, has_event: bool) -> bool:
        if self.events_only and not has_event:
            return False
        if self.ranks and split_prefix(line)[0] not in self.ranks:
            return False
        lower = line.lower()
        return all(word in lower for word in self.words)
