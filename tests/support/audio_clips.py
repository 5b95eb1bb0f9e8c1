"""Voice clips PyAV encodes for the tests, beside the emulator's AMR (``emulator.media``): MP3,
which the worker takes, and FLAC or WAV, which it refuses."""

from __future__ import annotations

import io
import math


def tone(container: str, codec: str, seconds: float, rate: int = 16000) -> bytes:
    """A 440 Hz tone encoded by PyAV (``mp3``/``libmp3lame``, ``flac``/``flac``, ``wav``/``pcm_s16le``)."""
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(codec, rate=rate)
        stream.layout = "mono"
        t = np.arange(int(rate * seconds)) / rate
        pcm = (0.3 * 32767 * np.sin(2 * math.pi * 440 * t)).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()
