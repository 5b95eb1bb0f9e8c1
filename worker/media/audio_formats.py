"""Which voice clips the worker decodes, and how long each lasts, read from the bytes before any
decoder sees them.

WeCom's voice messages are AMR (``media/get``: AMR-NB at 8 kHz, at most 60 s); its
documentation names SILK (the ``kf`` voice format) and MP3 besides. FFmpeg, through PyAV or the
``ffmpeg`` command, takes whatever container it can probe: an HLS playlist, an ffconcat list,
FLAC, WAV (a 641 KB FLAC became 115 MB of WAV). So the worker names the format itself and opens
the bytes with that demuxer alone:

- **AMR** (NB or WB, by the ``#!AMR\\n`` / ``#!AMR-WB\\n`` magic): every frame is 20 ms, whatever
  its size, so the frames are counted with FFmpeg's own size table (a 1-byte "no data" frame
  counts too: 10 MB of them would be 55 hours of silence);
- **MP3** (MPEG audio Layer III frames, an ID3v2 tag allowed before them): 1152 samples a frame
  (576 for MPEG-2 and 2.5), counted over the frames that follow one another from the start;
- **SILK** (``#!SILK_V3``) is recognised and refused: no decoder for it here;
- anything else is refused.

Counting stops just past ``max_duration_s``, so a probe costs at most that many frames. What
follows the counted frames is left to the decoder, which stops at the same limit by itself
(``worker.media.audio``): a clip is never decoded past the limit, whatever the count said.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_DURATION_S = 90.0  # VOICE_MAX_DURATION_S; WeCom records at most 60 s

AMR_NB_MAGIC = b"#!AMR\n"
AMR_WB_MAGIC = b"#!AMR-WB\n"
SILK_MAGIC = b"#!SILK_V3"
AMR_FRAMES_PER_S = 50  # 20 ms a frame
# Bytes of one storage-format frame, header byte included, by its frame type (FFmpeg's
# libavformat/amr.c: the reserved types are 1-byte frames there too).
AMR_NB_FRAME_BYTES = (13, 14, 16, 18, 20, 21, 27, 32, 6, 1, 1, 1, 1, 1, 1, 1)
AMR_WB_FRAME_BYTES = (18, 24, 33, 37, 41, 47, 51, 59, 61, 6, 1, 1, 1, 1, 1, 1)

# MPEG audio Layer III: kbit/s by bitrate index (0 "free format" and 15 are not taken), and the
# sampling rates by rate index, for MPEG-1 (version bits 3), MPEG-2 (2) and MPEG-2.5 (0).
MP3_KBPS = {True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
            False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


class AudioRefused(ValueError):
    """The bytes are not a voice clip the worker decodes (the message says what they are)."""


class AudioTooLong(AudioRefused):
    """The clip lasts longer than the limit: refused before decoding (or as the decoder passes it)."""

    def __init__(self, limit_s: float, seconds: float | None = None):
        said = f"over {limit_s:g} s" if seconds is None else f"{seconds:.0f} s, over {limit_s:g} s"
        super().__init__(f"too long ({said})")
        self.limit_s = limit_s


@dataclass(frozen=True)
class AudioInfo:
    """A clip the worker takes: its format, the one FFmpeg demuxer that opens it, the decoders
    its stream may name, and its duration (counted up to just past the limit)."""

    name: str  # "amr" or "mp3"
    demuxer: str
    codecs: tuple[str, ...]
    duration_s: float


def probe(data: bytes, max_duration_s: float = DEFAULT_MAX_DURATION_S) -> AudioInfo:
    """The clip's format and duration; ``AudioRefused`` for a format not taken, ``AudioTooLong``
    past ``max_duration_s``."""
    if data.startswith(AMR_WB_MAGIC):
        info = AudioInfo("amr", "amr", ("amrwb",),
                         _amr_seconds(data, len(AMR_WB_MAGIC), AMR_WB_FRAME_BYTES, max_duration_s))
    elif data.startswith(AMR_NB_MAGIC):
        info = AudioInfo("amr", "amr", ("amrnb",),
                         _amr_seconds(data, len(AMR_NB_MAGIC), AMR_NB_FRAME_BYTES, max_duration_s))
    elif data.startswith(SILK_MAGIC) or data[1:].startswith(SILK_MAGIC):
        raise AudioRefused("SILK audio, which nothing here decodes")
    else:
        seconds = _mp3_seconds(data, max_duration_s)
        if seconds is None:
            raise AudioRefused(f"not AMR or MP3 audio ({describe(data)})")
        info = AudioInfo("mp3", "mp3", ("mp3", "mp3float"), seconds)
    if info.duration_s > max_duration_s:
        raise AudioTooLong(max_duration_s)
    if info.duration_s <= 0:
        raise AudioRefused(f"no {info.name} frames in it")
    return info


def describe(data: bytes) -> str:
    """What the bytes look like, for the row's reason (never their content)."""
    for magic, name in ((b"fLaC", "FLAC"), (b"RIFF", "RIFF/WAV"), (b"OggS", "Ogg"), (b"#EXTM3U", "an HLS playlist"),
                        (b"ffconcat", "an ffconcat list"), (b"\x1aE\xdf\xa3", "Matroska/WebM")):
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp":
        return "MP4/M4A"
    return f"{len(data)} bytes of something else"


def _amr_seconds(data: bytes, at: int, sizes: tuple[int, ...], max_duration_s: float) -> float:
    most = int(max_duration_s * AMR_FRAMES_PER_S) + 1  # one frame past the limit is enough to refuse
    frames = 0
    while at < len(data) and frames < most:
        at += sizes[(data[at] >> 3) & 0x0F]
        frames += 1
    return frames / AMR_FRAMES_PER_S


def _mp3_frame(data: bytes, at: int) -> tuple[int, int, int] | None:
    """(frame bytes, samples, sampling rate) of the Layer III frame header at ``at``, or None."""
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (data[at + 1] >> 3) & 3, (data[at + 1] >> 1) & 3
    bitrate_index, rate_index = data[at + 2] >> 4, (data[at + 2] >> 2) & 3
    if version == 1 or layer != 1 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    mpeg1 = version == 3
    rate = MP3_RATES[version][rate_index]
    padding = (data[at + 2] >> 1) & 1
    size = (144000 if mpeg1 else 72000) * MP3_KBPS[mpeg1][bitrate_index] // rate + padding
    return size, 1152 if mpeg1 else 576, rate


def _id3_end(data: bytes) -> int:
    """Where the audio begins after an ID3v2 tag (0 without one)."""
    if not data.startswith(b"ID3") or len(data) < 10:
        return 0
    size = 0
    for byte in data[6:10]:  # "syncsafe": 7 bits a byte
        size = (size << 7) | (byte & 0x7F)
    return 10 + size + (10 if data[5] & 0x10 else 0)


def _mp3_seconds(data: bytes, max_duration_s: float) -> float | None:
    """The frames in a row from the start, as seconds; None unless it opens with two of them
    (or is one frame long), as FFmpeg's own probe asks."""
    at = _id3_end(data)
    first = _mp3_frame(data, at)
    if first is None:
        return None
    if at + first[0] < len(data) and _mp3_frame(data, at + first[0]) is None:
        return None
    seconds = 0.0
    while seconds <= max_duration_s:
        frame = _mp3_frame(data, at)
        if frame is None:
            break
        size, samples, rate = frame
        seconds += samples / rate
        at += size
    return seconds
