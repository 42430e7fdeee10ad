"""TensorBoard event files, written directly: no TensorFlow, tensorboardX or protobuf import. An
event file is a sequence of TFRecords (`record`: length, masked CRC-32C, data, masked CRC-32C)
whose data is a `tensorflow.Event` protocol buffer encoded by hand (`encode_event`); TensorBoard's
own reader reads them back (tests/rl/test_logging.py checks the values).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`: ((c >> 15 | c << 17) + 0xA282EAD8) mod 2^32."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64s as two's complement
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float,
    step: int,
    scalars: dict | None = None,
    file_version: str | None = None,
    session_start: bool = False,
) -> bytes:
    """The wire-format bytes of one Event: scalars {tag: value}, a file version or a session
    start, encoded by hand from protobuf's wire format:

        Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
                  Summary summary = 5; SessionLog session_log = 7; }
        Summary { repeated Value value = 1; }     Value { string tag = 1; float simple_value = 2; }
        SessionLog { enum status = 1; }           (START = 1)
    """
    event = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(int(step))
    if file_version is not None:
        event += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes_field(
                1,
                _bytes_field(1, str(tag).encode()) + _field(2, 5) + struct.pack("<f", float(value)),
            )
            for tag, value in scalars.items()
        )
        event += _bytes_field(5, values)
    if session_start:
        event += _bytes_field(7, _field(1, 0) + _varint(1))
    return event


def record(data: bytes) -> bytes:
    """`data` framed as one TFRecord: `uint64 length, uint32 masked CRC-32C of the length, data,
    uint32 masked CRC-32C of the data`, little-endian."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


class EventFile:
    """One TensorBoard event file in `folder` (`events.out.tfevents.<time>.<host><suffix>`, the
    name TensorBoard looks for), opened with its file-version event written."""

    def __init__(self, folder, suffix: str = ""):
        name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}{suffix}"
        self.path = Path(folder) / name
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self._file = os.fdopen(os.open(self.path, flags, 0o644), "ab")  # never through a link
        self._file.write(record(encode_event(time.time(), 0, file_version="brain.Event:2")))

    def scalars(self, step: int, values: dict) -> None:
        """Write one event holding each {tag: value} at `step`."""
        self._file.write(record(encode_event(time.time(), step, scalars=values)))

    def session_start(self, step: int) -> None:
        """A session start at `step`: TensorBoard drops the events of earlier sessions at or
        after it (those a killed process wrote after its last checkpoint)."""
        self._file.write(record(encode_event(time.time(), step, session_start=True)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
