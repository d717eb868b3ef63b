"""The open rooms of one server: codes, secrets, the cap on rooms, and forgetting closed ones.

The app builds one `RoomRegistry` and hands it to the room pages and the API (no module-level
state). A code is six characters a class can read off a projector (no look-alikes); the secret is
long and random, and only the teacher who opened the room gets it.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from classroom.room import Room
from classroom.settings import MAX_ROOMS, ROOM_IDLE_SECONDS, RoomError, RoomSettings
from classroom.vllm_room import VllmRoom
from engine.vllm import lab

CODE_ALPHABET = "ACDEFGHJKLMNPQRTUVWXY34679"  # no look-alikes: 0/O, 1/I, 2/Z, 5/S, 8/B
CODE_LENGTH = 6


class RoomRegistry:
    def __init__(self, device: str = "auto", max_rooms: int = MAX_ROOMS,
                 idle_seconds: float = ROOM_IDLE_SECONDS) -> None:
        self.device = device
        self.max_rooms = max_rooms
        self.idle_seconds = idle_seconds
        self._rooms: dict[str, Room] = {}
        self._opening: set[str] = set()  # codes whose engine is being built
        self._lock = threading.Lock()

    def open(self, settings: Any) -> Room:
        """Open a room with these settings (a RoomSettings, a dict or JSON text)."""
        if not isinstance(settings, RoomSettings):
            settings = RoomSettings.parse(settings)
        with self._lock:
            if len(self._rooms) + len(self._opening) >= self.max_rooms:
                raise RoomError(f"this server has {self.max_rooms} rooms open, the most it holds; "
                                "close one (or wait for an idle one to close) and try again")
            code = self._new_code()
            self._opening.add(code)
        try:  # building the engine may load the model: not under the registry's lock
            room = self._make(code, settings)
        finally:
            with self._lock:
                self._opening.discard(code)
        with self._lock:
            self._rooms[code] = room
        return room

    def _make(self, code: str, settings: RoomSettings) -> Room | VllmRoom:
        secret = secrets.token_urlsafe(16)
        if settings.served_by == "vllm":
            server = lab.current()
            if server is None:
                raise RoomError("no vLLM runs beside PagedLab here: start one in the app's vLLM "
                                "tab (Start one here), or start the app with --vllm-events and "
                                "--vllm-url, then open the room again")
            return VllmRoom(code, secret, settings, server, self.idle_seconds, on_close=self._forget)
        return Room(code, secret, settings, self.device, self.idle_seconds, on_close=self._forget)

    def get(self, code: Any) -> Room:
        key = code.strip().upper() if isinstance(code, str) else ""
        room = self._rooms.get(key)
        if room is None or room.closed:
            minutes = self.idle_seconds / 60
            raise RoomError(f"no open room has the code {str(code)[:12]!r}; check it with your "
                            f"teacher (a room closes after {minutes:g} minutes without activity)")
        return room

    def close_all(self) -> None:
        for room in list(self._rooms.values()):
            room.close()

    def __len__(self) -> int:
        return len(self._rooms)

    def _new_code(self) -> str:
        while True:
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            if code not in self._rooms and code not in self._opening:
                return code

    def _forget(self, room: Room) -> None:
        with self._lock:
            if self._rooms.get(room.code) is room:
                del self._rooms[room.code]
