"""Classroom rooms: one live engine shared by a whole class (no Gradio here; ui/room_*.py draws
the pages and serves the API)."""

from classroom.registry import RoomRegistry
from classroom.room import ACTIONS, Room
from classroom.settings import RoomError, RoomSettings

__all__ = ["ACTIONS", "Room", "RoomError", "RoomRegistry", "RoomSettings"]
