"""Write the small encoded audio fixtures used by the Rust audio unit tests.

Deterministic: every signal comes from ``numpy.random.default_rng(SEED)`` (no global RNG), so rerunning
this script rewrites the same PCM. Lossy files are not byte-identical between runs (libsndfile picks a
random OGG stream serial; encoders change between versions), so the Rust tests never compare lossy
decodes against hard-coded values: they compare windowed decodes with full decodes of the same file, and
lossless (FLAC/WAV) decodes with the PCM written here.

Usage::

    python scripts/make_codec_fixtures.py            # writes the 10 files below into rust/core/tests/data/
    python scripts/make_codec_fixtures.py --check    # writes no fixture, only prints sizes (each < 200 KB)
    python scripts/make_codec_fixtures.py --bench-dir /tmp/birdjepa-bench   # + realistic timing inputs

Either way it then prints the size of every file in the output folder and fails if one is 200 KB or more.

Fixtures written (10 files, each < 200 KB):

- ``birds_44k_stereo.flac``   1.5 s, 44.1 kHz, stereo, PCM_16 (lossless)
- ``birds_44k_stereo.flac.mono_f32.txt``  its frame count and the FNV-1a 64 hash of its exact float32
  mono mix (text)
- ``birds_22k_mono_short.flac`` 1.5 s, 22.05 kHz, mono, PCM_16 (shorter than a 5 s clip)
- ``birds_48k_stereo.ogg``    8.0 s, 48 kHz, stereo, Vorbis
- ``birds_44k_stereo_30s.ogg``  30 s, 44.1 kHz, stereo, Vorbis (the timing fixture)
- ``birds_32k_mono.mp3``      4.0 s, 32 kHz, mono, MPEG layer III (variable bit rate, a Xing header)
- ``birds_32k_mono_cbr.mp3``  4.0 s, 32 kHz, mono, MPEG layer III at a constant bit rate (an Info
  header); its own generator (``SEED + 1``), so adding it left the others' signals as they were
- ``birds_24k_mono_8kbps.mp3``  8.0 s, 24 kHz, mono, MPEG-2 layer III at 8 kbps (constant): a bit
  reservoir that reaches back many frames; its own generator (``SEED + 2``), shared with the next
- ``birds_48k_mono_vbr.mp3``  6.0 s, 48 kHz, mono, MPEG layer III, variable rate (``SEED + 2``)
- ``birds_32k_mono_crc.mp3``  4.0 s, 32 kHz, mono, MPEG layer III with CRC protection (``lame -p``, the
  LAME command line, which must be on the PATH: libsndfile cannot set it; ``SEED + 3``): its Info frame's
  tag follows the CRC, which symphonia's demuxer does not read

With ``--bench-dir DIR`` (also with ``--check``), timing inputs that are not committed:
``DIR/bench_44k_stereo_30s.ogg`` and ``DIR/bench_48k_stereo_30s.ogg`` (30 s, stereo, Vorbis at
libsndfile's default quality, louder noise; ``SEED + 1``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import soundfile as sf

SEED = 20240611
OUT = Path(__file__).resolve().parent.parent / "rust" / "core" / "tests" / "data"
MAX_BYTES = 200 * 1024


def birdsong(
    rng: np.random.Generator,
    seconds: float,
    rate: int,
    channels: int,
    noise: float = 0.0003,
    calls_per_s: float = 2.5,
) -> np.ndarray:
    """Frequency-modulated whistles with smooth envelopes over faint noise, in [-0.9, 0.9]."""
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    out = np.zeros((n, channels))
    n_calls = max(2, int(seconds * calls_per_s))
    for _ in range(n_calls):
        start = rng.uniform(0.0, seconds - 0.3)
        dur = rng.uniform(0.08, 0.45)
        f0 = rng.uniform(1500.0, 7000.0)
        sweep = rng.uniform(-2500.0, 2500.0)
        vib_rate = rng.uniform(5.0, 40.0)
        vib_depth = rng.uniform(0.0, 400.0)
        amp = rng.uniform(0.1, 0.35)
        pan = rng.uniform(0.3, 1.0, size=channels)
        mask = (t >= start) & (t < start + dur)
        tt = t[mask] - start
        freq = f0 + sweep * tt / dur + vib_depth * np.sin(2 * np.pi * vib_rate * tt)
        phase = 2 * np.pi * np.cumsum(freq) / rate
        env = np.sin(np.pi * tt / dur) ** 2
        call = amp * env * (np.sin(phase) + 0.3 * np.sin(2 * phase))
        out[mask] += call[:, None] * pan[None, :]
    out += noise * rng.standard_normal((n, channels))
    peak = np.max(np.abs(out))
    return (out * (0.9 / peak)).astype(np.float64)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_bench(folder: Path) -> None:
    """Timing inputs closer to field recordings: louder noise, libsndfile's default Vorbis quality."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED + 1)
    for rate in (44100, 48000):
        x = birdsong(rng, 30.0, rate, 2, noise=0.01, calls_per_s=2.5)
        path = folder / f"bench_{rate // 1000}k_stereo_30s.ogg"
        sf.write(path, x, rate, format="OGG", subtype="VORBIS")
        print(f"{path} {path.stat().st_size / 1024:.1f} KB")


def write_cbr_mp3(out: Path) -> None:
    x = birdsong(np.random.default_rng(SEED + 1), 4.0, 32000, 1)
    sf.write(out / "birds_32k_mono_cbr.mp3", x[:, 0], 32000, format="MP3", subtype="MPEG_LAYER_III",
             bitrate_mode="CONSTANT", compression_level=0.5)  # fmt: skip


def write_low_rate_mp3s(out: Path) -> None:
    """Streams whose bit reservoir reaches back many frames (a crop's decode must start further back than
    a few frames): MPEG-2 at 24 kHz and libsndfile's lowest constant rate (8 kbps: 24-byte frames, 11
    bytes of main data each, a reservoir of up to 255), and MPEG-1 at 48 kHz, variable rate."""
    rng = np.random.default_rng(SEED + 2)
    x = birdsong(rng, 8.0, 24000, 1, noise=0.01)
    sf.write(out / "birds_24k_mono_8kbps.mp3", x[:, 0], 24000, format="MP3", subtype="MPEG_LAYER_III",
             bitrate_mode="CONSTANT", compression_level=0.99)  # fmt: skip
    x = birdsong(rng, 6.0, 48000, 1, noise=0.01)
    sf.write(out / "birds_48k_mono_vbr.mp3", x[:, 0], 48000, format="MP3", subtype="MPEG_LAYER_III")


def write_crc_mp3(out: Path) -> None:
    import shutil
    import subprocess
    import tempfile

    if shutil.which("lame") is None:
        raise SystemExit("the CRC-protected MP3 fixture needs the LAME command line (apt-get install lame)")
    x = birdsong(np.random.default_rng(SEED + 3), 4.0, 32000, 1)
    with tempfile.TemporaryDirectory() as tmp:
        sf.write(Path(tmp) / "x.wav", x[:, 0], 32000, subtype="PCM_16")
        subprocess.run(["lame", "--quiet", "-p", "-b", "48", str(Path(tmp) / "x.wav"),
                        str(out / "birds_32k_mono_crc.mp3")], check=True)  # fmt: skip


def ffmpeg_mono(path: Path) -> np.ndarray:
    """ffmpeg's decode of ``path`` mixed to mono as the Rust decoder mixes it: float32, the channels summed
    in order, then divided by their count (16- and 24-bit samples convert to float32 exactly)."""
    import subprocess

    probe = ["ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries", "stream=channels",
             "-of", "csv=p=0", str(path)]  # fmt: skip
    channels = int(subprocess.run(probe, check=True, capture_output=True, text=True).stdout.split(",")[0])
    pcm = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "f32le", "-c:a", "pcm_f32le", "-"],
                         check=True, capture_output=True).stdout  # fmt: skip
    x = np.frombuffer(pcm, "<f4").reshape(-1, channels)
    mono = x[:, 0].copy()
    for c in range(1, channels):
        mono += x[:, c]
    return mono / np.float32(channels) if channels > 1 else mono


def aifc_none(aiff: bytes) -> bytes:
    """An AIFF's samples as an AIFF-C of compression ``NONE`` (big-endian PCM, as AIFF), which ffmpeg
    writes as AIFF: the COMM chunk extended, a FVER chunk, and an ``ANNO`` chunk after the sound data
    (a chunk after ``SSND`` is allowed, and read by symphonia as 8 bytes of samples)."""
    import struct

    assert aiff[:4] == b"FORM" and aiff[8:12] == b"AIFF"
    chunks, at = [], 12
    while at + 8 <= len(aiff):
        kind, size = aiff[at : at + 4], struct.unpack(">I", aiff[at + 4 : at + 8])[0]
        body = aiff[at + 8 : at + 8 + size]
        if kind == b"COMM":
            body = body[:18] + b"NONE" + bytes([14]) + b"not compressed" + b"\0"
        chunks.append(kind + struct.pack(">I", len(body)) + body + b"\0" * (len(body) & 1))
        at += 8 + size + (size & 1)
    fver = b"FVER" + struct.pack(">II", 4, 0xA2805140)
    anno = b"ANNO" + struct.pack(">I", 16) + b"birdjepa fixture"
    body = b"AIFC" + fver + b"".join(chunks) + anno
    return b"FORM" + struct.pack(">I", len(body)) + body


def write_ffmpeg_fixtures(out: Path) -> None:
    """AIFF, AIFF-C and M4A files ffmpeg writes from the 44.1 kHz and 22.05 kHz FLAC fixtures, each with
    ffmpeg's decode of it mixed to mono: ``NAME.ffmpeg.txt`` (its frame count and FNV-1a 64 hash) for the
    lossless ones, ``NAME.ffmpeg_f32`` (the samples, little-endian float32) for AAC, whose decoders may
    round differently."""
    import shutil
    import subprocess

    if shutil.which("ffmpeg") is None:
        raise SystemExit("the AIFF and M4A fixtures need ffmpeg on the PATH")

    def ffmpeg(src: str, dst: str, *args: str) -> None:
        cmd = ["ffmpeg", "-v", "error", "-y", "-i", str(out / src), *args, "-map_metadata", "-1",
               "-fflags", "+bitexact", "-flags:a", "+bitexact", str(out / dst)]  # fmt: skip
        subprocess.run(cmd, check=True)

    ffmpeg("birds_44k_stereo.flac", "birds_44k_stereo.aiff", "-t", "0.5", "-c:a", "pcm_s16be")
    ffmpeg("birds_44k_stereo.flac", "birds_44k_stereo_sowt.aiff", "-t", "0.5", "-c:a", "pcm_s16le")
    ffmpeg("birds_22k_mono_short.flac", "birds_22k_mono_24bit.aiff", "-c:a", "pcm_s24be")
    none = out / "birds_22k_mono_24bit_none.aifc"
    none.write_bytes(aifc_none((out / "birds_22k_mono_24bit.aiff").read_bytes()))
    (out / "birds_22k_mono_24bit.aiff").unlink()
    ffmpeg("birds_44k_stereo.flac", "birds_44k_stereo_alac.m4a", "-c:a", "alac")
    # 0.7 s: 30_870 frames, no whole number of 1024-sample AAC frames (the last one padded).
    ffmpeg("birds_44k_stereo.flac", "birds_44k_stereo_aac.m4a", "-t", "0.7", "-c:a", "aac", "-b:a", "96k")
    for name in [
        "birds_44k_stereo.aiff",
        "birds_44k_stereo_sowt.aiff",
        none.name,
        "birds_44k_stereo_alac.m4a",
    ]:
        mono = ffmpeg_mono(out / name)
        (out / f"{name}.ffmpeg.txt").write_text(
            f"frames={len(mono)} fnv1a64={fnv1a64(mono.astype('<f4').tobytes()):016x}\n"
        )
    name = "birds_44k_stereo_aac.m4a"
    (out / f"{name}.ffmpeg_f32").write_bytes(ffmpeg_mono(out / name).astype("<f4").tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--check", action="store_true", help="write no fixture, only print the existing ones' sizes"
    )
    ap.add_argument(
        "--out", type=Path, default=OUT, help="the fixtures' folder (default: rust/core/tests/data/)"
    )
    ap.add_argument(
        "--bench-dir",
        type=Path,
        default=None,
        help="also write realistic-bitrate timing inputs (not committed) into this folder",
    )
    args = ap.parse_args()
    if args.bench_dir is not None:
        write_bench(args.bench_dir)
    out: Path = args.out
    if not args.check:
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(SEED)

        x = birdsong(rng, 1.5, 44100, 2)
        pcm16 = np.round(x * 32767).astype("<i2")
        sf.write(out / "birds_44k_stereo.flac", pcm16, 44100, format="FLAC", subtype="PCM_16")
        # Exact reference for the Rust test: FNV-1a 64 of the little-endian f32 bytes of the mono mix
        # (a/32768 + b/32768) / 2, which is exact in float32 for 16-bit input.
        mono = (
            (pcm16[:, 0].astype(np.float32) / np.float32(32768))
            + (pcm16[:, 1].astype(np.float32) / np.float32(32768))
        ) / np.float32(2)
        (out / "birds_44k_stereo.flac.mono_f32.txt").write_text(
            f"frames={len(mono)} fnv1a64={fnv1a64(mono.astype('<f4').tobytes()):016x}\n"
        )

        x = birdsong(rng, 1.5, 22050, 1)
        sf.write(out / "birds_22k_mono_short.flac", x[:, 0], 22050, format="FLAC", subtype="PCM_16")

        x = birdsong(rng, 8.0, 48000, 2)
        sf.write(
            out / "birds_48k_stereo.ogg", x, 48000, format="OGG", subtype="VORBIS", compression_level=0.9
        )

        x = birdsong(rng, 30.0, 44100, 2, noise=0.00005, calls_per_s=1.5)
        sf.write(
            out / "birds_44k_stereo_30s.ogg", x, 44100, format="OGG", subtype="VORBIS", compression_level=1.0
        )

        x = birdsong(rng, 4.0, 32000, 1)
        sf.write(out / "birds_32k_mono.mp3", x[:, 0], 32000, format="MP3", subtype="MPEG_LAYER_III")

        write_cbr_mp3(out)
        write_low_rate_mp3s(out)
        write_crc_mp3(out)
        write_ffmpeg_fixtures(out)

    too_big = []
    for p in sorted(out.iterdir()):
        size = p.stat().st_size
        print(f"{p.name:32s} {size / 1024:8.1f} KB")
        if size >= MAX_BYTES:
            too_big.append(p.name)
    if too_big:
        raise SystemExit(f"fixtures over {MAX_BYTES} bytes: {too_big}")


if __name__ == "__main__":
    main()
