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
    """`advance(next_stage)` after each stage; `close()` at the end (the bar then disappears).

    With `stages=None` the number of stages is not known up front: the bar shows the current
    stage and the elapsed time (kiln's inductor: autograd, then each ATen graph's compile,
    whose own bar shows below it).
    """

    def __init__(self, name: str, stages: list[str] | None, first: str = ""):
        self.bar = None
        stream = sys.stderr
        if hasattr(stream, "isatty") and stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # no tqdm: no bar
                return

            size = shutil.get_terminal_size((80, 24))  # a terminal that reports no size: 80x24
            self.name = name
            layout = "{desc} {bar} {n_fmt}/{total_fmt}" if stages else "{desc} {elapsed}"
            self.bar = tqdm(total=len(stages) if stages else None, desc=self._desc(stages[0] if stages else first),
                            leave=False, file=stream, ncols=min(100, size.columns), nrows=max(2, size.lines),
                            delay=config.progress_delay, bar_format=layout)

    def _desc(self, stage: str) -> str:
        return f"kiln {self.name} [{stage}]" if stage else f"kiln {self.name}"

    def advance(self, next_stage: str = "") -> None:
        if self.bar is not None:
            self.bar.set_description_str(self._desc(next_stage), refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None  # a lazily compiled variant may report after the bar is gone
