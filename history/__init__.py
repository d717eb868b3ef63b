"""A run's history: its config, op log, cursor, recorded frames, checkpoints and the engine at a
position (history/run_history.py), for every page that plays a run: the Playground and Serving,
a lesson, a classroom's lesson, a ZeroGPU call."""

from history.frame import Frame
from history.run_history import NEW_ENGINE, RunHistory

__all__ = ["NEW_ENGINE", "Frame", "RunHistory"]
