"""A voice clip decoded to the 16 kHz mono WAV a speech-to-text server takes.

PyAV decodes it (Debian's ``ffmpeg`` when PyAV is missing; which one is found once, at
start-up). Only AMR and MP3 are opened, each with its own demuxer and never by probing, and only
after their duration was counted from the bytes (``worker.media.audio_formats``); the decoding
stops as soon as its output passes that limit, so no clip becomes more WAV than the limit holds.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

from worker.media.audio_formats import DEFAULT_MAX_DURATION_S, AudioRefused, AudioTooLong, probe

# What decoding may add to the counted frames (decoder delay, the resampler's tail) before the
# output counts as longer than the limit.
DECODE_SLACK_S = 1.0


def find_decoder() -> str | None:
    """``"pyav"``, ``"ffmpeg"`` (its path) or None: what decodes AMR here."""
    try:
        import av  # noqa: F401, PLC0415

        return "pyav"
    except ImportError:
        pass
    return shutil.which("ffmpeg")


def to_wav(data: bytes, decoder: str | None, rate: int = 16000, timeout_s: float = 30.0,
           max_duration_s: float = DEFAULT_MAX_DURATION_S) -> bytes:
    """The voice clip in ``data`` (AMR or MP3, at most ``max_duration_s`` long) as 16-bit mono
    WAV at ``rate``; ``ValueError`` when it cannot be decoded: ``AudioRefused`` for a format not
    taken, ``AudioTooLong`` past the limit (both found before decoding)."""
    if decoder is None:
        raise ValueError("no audio decoder (install PyAV, or ffmpeg)")
    info = probe(data, max_duration_s)
    most_samples = int((max_duration_s + DECODE_SLACK_S) * rate)
    if decoder == "pyav":
        return _wav_pyav(data, info.demuxer, info.codecs, rate, most_samples, max_duration_s)
    try:
        done = subprocess.run([decoder, "-hide_banner", "-loglevel", "error", "-f", info.demuxer, "-i", "pipe:0",
                               "-t", f"{max_duration_s + DECODE_SLACK_S:g}", "-ac", "1", "-ar", str(rate),
                               "-f", "wav", "pipe:1"], input=data, capture_output=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise ValueError("ffmpeg took too long") from None
    if done.returncode != 0 or len(done.stdout) <= 44:
        raise ValueError(f"ffmpeg could not decode it: {done.stderr.decode(errors='replace')[-120:]}")
    if (len(done.stdout) - 44) // 2 >= most_samples:  # -t cut it at the limit: it went on
        raise AudioTooLong(max_duration_s)
    return done.stdout


def _wav_pyav(data: bytes, demuxer: str, codecs: tuple[str, ...], rate: int, most_samples: int,
              max_duration_s: float) -> bytes:
    import av  # noqa: PLC0415

    pcm = bytearray()
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            if not container.streams.audio:
                raise ValueError("no audio stream")
            stream = container.streams.audio[0]
            if stream.codec_context.name not in codecs:
                raise AudioRefused(f"a {stream.codec_context.name} stream, not {'/'.join(codecs)}")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pcm += bytes(out.planes[0])[: out.samples * 2]
                if len(pcm) // 2 > most_samples:
                    raise AudioTooLong(max_duration_s)
            for out in resampler.resample(None):
                pcm += bytes(out.planes[0])[: out.samples * 2]
    except av.error.FFmpegError as exc:
        raise ValueError(f"cannot decode: {type(exc).__name__}") from None
    if not pcm:
        raise ValueError("no audio in it")
    if len(pcm) // 2 > most_samples:
        raise AudioTooLong(max_duration_s)
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(bytes(pcm))
    return out.getvalue()
