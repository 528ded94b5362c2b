"""What a node agent saw, counted at the node itself: the most tasks it was asked to run at once
and the prompts it was handed, in order. Written as JSON to ``GEMMANET_NODE_STATS_FILE`` when
that is set (diagnostics: it is how tests check that the coordinator never overcommits a node
and keeps the admission queue's order, without trusting the coordinator's own counters)."""

from __future__ import annotations

import json
import os

STATS_FILE_ENV = "GEMMANET_NODE_STATS_FILE"
#: prompts kept (their first characters), so the file stays small in a long run
MAX_PROMPTS = 10_000
PROMPT_CHARS = 64


class NodeStats:
    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get(STATS_FILE_ENV) or None
        #: the most assigns outstanding at once, counting the one arriving (refused or not)
        self.peak_asked = 0
        self.prompts: list[str] = []

    def asked(self, duplicate: bool, running: int, prompt: str) -> None:
        """An assign arrived while ``running`` tasks run."""
        if self.path is None or duplicate:
            return
        self.peak_asked = max(self.peak_asked, running + 1)
        if len(self.prompts) < MAX_PROMPTS:
            self.prompts.append(prompt[:PROMPT_CHARS])
        temporary = f"{self.path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"peak_asked": self.peak_asked, "prompts": self.prompts}, handle)
        os.replace(temporary, self.path)
