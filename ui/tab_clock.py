"""The page's clock on its tab events: which of a page's tab events is the latest.

Gradio answers a page's tab events side by side (one of them unqueued), so they reach the
server, and their answers reach the page, in any order. Each tab event carries the page's clock
as it left the page (`CLOCK_JS`, ms); a TabClock keeps the latest one applied, so that an older
event, or an answer that a later event overtook, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a tab event's last input, filled in the page as the event leaves it: the page's clock (ms)
CLOCK_JS = "(...inputs) => [...inputs.slice(0, -1), performance.now()]"


@dataclass
class TabClock:
    latest: float = float("-inf")  # the page's clock on the latest tab event applied

    def admit(self, at: float | None) -> bool:
        """Whether the event sent at `at` is the latest (it becomes so); None (no clock, as
        from an API call) is always admitted."""
        if at is None:
            return True
        if at < self.latest:
            return False
        self.latest = at
        return True

    def still_latest(self, at: float | None) -> bool:
        """Whether no later tab event came while the one sent at `at` was being answered."""
        return at is None or at >= self.latest
