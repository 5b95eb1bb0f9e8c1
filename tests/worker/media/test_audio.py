"""worker/media/audio.py and audio_formats.py: a voice clip decoded to 16 kHz mono WAV, AMR and MP3
only, never longer than the limit, both decided from the bytes before any decoder runs."""

from __future__ import annotations

import io
import os
import wave

import pytest

from emulator import media as samples
from tests.support.audio_clips import tone
from worker.media import audio_formats
from worker.media.audio import find_decoder, to_wav
from worker.media.audio_formats import AudioRefused, AudioTooLong, probe


def wav_seconds(wav: bytes) -> float:
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        return w.getnframes() / 16000


@pytest.fixture
def no_decoding(monkeypatch):
    """Any decoding fails the test: what is refused must be refused before PyAV opens it."""
    import av

    opened = av.open

    def refuse(file, mode="r", **kwargs):
        if mode == "r":
            raise AssertionError("the decoder was asked to open it")
        return opened(file, mode, **kwargs)  # a test making its clip

    monkeypatch.setattr(av, "open", refuse)


# -- decoding ------------------------------------------------------------------------------------
def test_amr_decodes_to_16k_mono_wav():
    wav = to_wav(samples.amr_clip(2.0), find_decoder())
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnchannels()) == (16000, 1)
        assert 1.9 <= w.getnframes() / 16000 <= 2.2


def test_mp3_decodes_to_16k_mono_wav():
    for rate in (44100, 16000, 8000):  # MPEG-1, MPEG-2 and MPEG-2.5 frames
        clip = tone("mp3", "libmp3lame", 3.0, rate)
        assert probe(clip).name == "mp3" and 2.9 <= probe(clip).duration_s <= 3.3
        assert 2.9 <= wav_seconds(to_wav(clip, find_decoder())) <= 3.2


def test_garbage_and_no_decoder_are_refused():
    with pytest.raises(ValueError):
        to_wav(b"#!AMR\n" + os.urandom(10), find_decoder())
    with pytest.raises(ValueError):
        to_wav(b"not audio at all" * 10, find_decoder())
    with pytest.raises(ValueError):
        to_wav(samples.amr_clip(), None)


# -- the formats taken: decided before decoding --------------------------------------------------
@pytest.mark.parametrize("make, named", [
    (lambda: tone("flac", "flac", 1.0), "FLAC"),
    (lambda: tone("wav", "pcm_s16le", 1.0), "RIFF/WAV"),
    (lambda: b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/hostname\n#EXT-X-ENDLIST\n",
     "an HLS playlist"),
    (lambda: b"ffconcat version 1.0\nfile /etc/hostname\n", "an ffconcat list"),
])
def test_containers_other_than_amr_and_mp3_are_refused_before_decoding(no_decoding, make, named):
    """PyAV would probe and decode any of these (a 641 KB FLAC became 115 MB of WAV)."""
    with pytest.raises(AudioRefused, match=f"not AMR or MP3 audio \\({named}\\)"):
        to_wav(make(), "pyav")


def test_silk_is_recognised_and_refused(no_decoding):
    for clip in (b"#!SILK_V3" + bytes(100), b"\x02#!SILK_V3" + bytes(100)):
        with pytest.raises(AudioRefused, match="SILK"):
            to_wav(clip, "pyav")


# -- the duration: counted before decoding -------------------------------------------------------
def test_the_frames_are_counted_without_decoding(no_decoding):
    assert probe(samples.handmade_amr(2.0)).duration_s == 2.0  # 100 frames of 20 ms
    assert probe(samples.handmade_amr(60.0), max_duration_s=60).duration_s == 60.0  # WeCom's longest
    wideband = audio_formats.AMR_WB_MAGIC + bytes([0x44]) + bytes(60)  # one 23.85 kbit/s frame
    assert probe(wideband).codecs == ("amrwb",) and probe(wideband).duration_s == 0.02


def test_a_clip_over_the_limit_is_refused_before_decoding(no_decoding):
    with pytest.raises(AudioTooLong, match="over 90 s"):
        to_wav(samples.handmade_amr(100.0), "pyav")  # the default limit: VOICE_MAX_DURATION_S=90
    with pytest.raises(AudioTooLong, match="over 3 s"):
        to_wav(tone("mp3", "libmp3lame", 5.0), "pyav", max_duration_s=3)
    # 10 MB of 1-byte "no data" frames: 55 hours of silence, refused after counting 90 s of them
    with pytest.raises(AudioTooLong):
        probe(audio_formats.AMR_NB_MAGIC + bytes([0x7C]) * 10_000_000)


def test_a_clip_within_the_limit_is_decoded():
    assert 1.9 <= wav_seconds(to_wav(samples.amr_clip(2.0), find_decoder(), max_duration_s=3)) <= 2.2


def test_the_decoder_stops_at_the_limit_whatever_the_count_said():
    """One junk byte after a second of MP3 frames ends the count there; FFmpeg's demuxer finds
    the ten seconds of frames after it and decodes them: the decoding stops at the limit."""
    first, rest = tone("mp3", "libmp3lame", 1.0), tone("mp3", "libmp3lame", 10.0)
    clip = first + b"\x00" + rest[audio_formats._id3_end(rest):]
    assert probe(clip, max_duration_s=3).duration_s < 1.5
    assert wav_seconds(to_wav(clip, find_decoder(), max_duration_s=30)) > 10  # what it holds
    with pytest.raises(AudioTooLong):
        to_wav(clip, find_decoder(), max_duration_s=3)


# -- the ffmpeg command ----------------------------------------------------------------------------
def fake_ffmpeg(tmp_path, seconds: float = 1.0):
    """An ``ffmpeg`` that takes AMR on stdin (``-f amr`` named) and writes ``seconds`` of WAV."""
    import sys

    fake = tmp_path / "ffmpeg"
    fake.write_text(f"#!{sys.executable}\n" + (
        "import io, sys, wave\n"
        "args = sys.argv[1:]\n"
        "data = sys.stdin.buffer.read()\n"
        "if not data.startswith(b'#!AMR') or args[args.index('-ar') + 1] != '16000'"
        " or args[args.index('-f') + 1] != 'amr':\n"
        "    sys.stderr.write('Invalid data found when processing input'); sys.exit(1)\n"
        "out = io.BytesIO()\n"
        "w = wave.open(out, 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)\n"
        f"w.writeframes(bytes(int({seconds} * 32000))); w.close()\n"
        "sys.stdout.buffer.write(out.getvalue())\n"))
    fake.chmod(0o755)
    return str(fake)


def test_the_ffmpeg_decoder_is_called_as_a_pipe(tmp_path):
    """Without PyAV the worker runs the ffmpeg it found: AMR on stdin, 16 kHz mono WAV on stdout."""
    fake = fake_ffmpeg(tmp_path)
    wav = to_wav(samples.handmade_amr(), fake)
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnframes()) == (16000, 16000)
    with pytest.raises(ValueError, match="Invalid data"):  # an MP3: taken, but this ffmpeg refuses it
        to_wav(tone("mp3", "libmp3lame", 1.0), fake)
    with pytest.raises(AudioRefused):  # not audio at all: ffmpeg never runs
        to_wav(b"not amr", fake)


def test_the_ffmpeg_decoder_is_stopped_at_the_limit(tmp_path):
    with pytest.raises(AudioTooLong):
        to_wav(samples.handmade_amr(0.5), fake_ffmpeg(tmp_path, seconds=3.0), max_duration_s=1)
