"""A progress bar over the stages of one graph's compile: shown on a terminal only, once a compile runs long.

`tqdm`'s `delay` keeps short compiles silent (the bar appears after
`kiln.config.progress_delay` seconds); when stderr is not a terminal nothing is
drawn at all, so logs and CI output stay clean.
"""
from __future__ import annotations

import shutil
import sys

from kiln.config import config


class StageProgress:
    """`advance(next_stage)` after each stage; `close()` at the end (the bar then disappears)."""

    def __init__(self, name: str, stages: list[str]):
        self.bar = None
        stream = sys.stderr
        if stages and hasattr(stream, "isatty") and stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # no tqdm: no bar
                return

            size = shutil.get_terminal_size((80, 24))  # a terminal that reports no size: 80x24
            self.bar = tqdm(total=len(stages), desc=f"kiln {name}", unit="stage", leave=False, file=stream,
                            ncols=min(100, size.columns), nrows=max(2, size.lines),
                            delay=config.progress_delay, bar_format="{desc}: {bar} {n_fmt}/{total_fmt} {postfix}")
            self.bar.set_postfix_str(stages[0], refresh=False)

    def advance(self, next_stage: str = "") -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(next_stage, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
