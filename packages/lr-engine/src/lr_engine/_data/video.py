"""Decoding LeRobot video features, frame for frame as LeRobot 0.6.1 does (and encoding them, for
tests and the demo).

Contract:

- `VideoDecoder(backend, tolerance_s=..., max_open_files=..., threads=1)` is meant to live once per process
  (in the training process, and one in each DataLoader worker). Creating it opens nothing: it opens
  a video file the first time that process asks for it and keeps at most `max_open_files` open
  (least recently used closed first), so a worker does not reopen a file per sample. A pickled
  copy (spawned workers) carries only the settings; a forked copy notices the new pid and leaves
  the parent's open files alone (their file offsets and decoder threads belong to the parent).
- `decoder.frames(path, timestamps, key=..., episode=...)` returns float32 (N, C, H, W) RGB in
  [0, 1], one frame per query time (seconds in the file). Frames are picked as LeRobot's loader
  picks them: seek to the nearest keyframe at or before the first query time (give or take
  `tolerance_s`; never decoding from the file's start), decode forward until the last one, take
  for each query the decoded frame whose timestamp is closest, and refuse it when that distance
  exceeds `tolerance_s`. Pixels come from FFmpeg's rgb24 conversion, as in LeRobot's pyav path.
- Backends: `pyav` (default; PyAV's wheels bundle FFmpeg with AV1 (dav1d), H.264 and HEVC
  decoders) and `torchcodec` (only where `import torchcodec` and its decoder load: it needs a
  system FFmpeg; elsewhere asking for it is an error that says to use pyav).
- Every problem is a `DatasetError` that names the file, the episode and the feature: a missing
  file, a truncated or corrupt one, a codec this FFmpeg cannot decode, a query time past the end
  of the video or farther than `tolerance_s` (`--dataset.tolerance_s`) from every frame.

`encode_video(frames, path, fps, codec=...)` writes an MP4 the way LeRobot's PyAV writer does
(libsvtav1 for av1, libx264, libx265; yuv420p, g=2, crf=30), under a temporary name then renamed.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .errors import DatasetError

BACKENDS = ("pyav", "torchcodec")
DEFAULT_TOLERANCE_S = 1e-4
DEFAULT_MAX_OPEN_FILES = 32
ENCODERS = {"av1": "libsvtav1", "h264": "libx264", "hevc": "libx265"}
SVTAV1_PRESET = 12  # LeRobot's default preset for libsvtav1

# Containers a forked worker inherited from its parent. Freeing them in the child would join
# decoder threads that exist only in the parent (a hang), so the child keeps them, unused.
_INHERITED: list[Any] = []


@dataclass
class _Span:
    """Frames decoded for one request, in presentation order."""

    times: np.ndarray  # seconds, float64
    frames: list[Any]  # backend frames, converted to RGB only when picked
    at_end: bool  # decoding reached the end of the stream
    decoded: int  # frames the codec produced for this request


class _Unsupported(Exception):
    """The file opens but holds nothing this FFmpeg can decode."""


class _OpenVideo(Protocol):
    def span(self, queries: np.ndarray, tolerance_s: float) -> _Span: ...

    def rgb(self, frame: Any) -> torch.Tensor: ...

    def close(self) -> None: ...


def _pyav_errors() -> tuple[type[BaseException], ...]:
    import av

    return (av.error.FFmpegError, OSError, ValueError, RuntimeError, EOFError)


class _PyAVVideo:
    """An open container and its first video stream."""

    def __init__(self, path: Path, threads: int) -> None:
        import av

        self.container = av.open(str(path))
        try:
            self.stream = self._video_stream()
        except BaseException:
            self.container.close()
            raise
        self.stream.codec_context.thread_count = threads
        self.time_base = self.stream.time_base or Fraction(1, 1)
        self.start = float(self.stream.start_time * self.time_base) if self.stream.start_time is not None else 0.0
        rate = self.stream.average_rate or self.stream.guessed_rate
        self.frame_s = 1.0 / float(rate) if rate else 0.1
        # How far the demuxer's seek index runs behind presentation time; learnt on the way.
        self.seek_lag = 0.0

    def _video_stream(self) -> Any:
        if not self.container.streams.video:
            raise _Unsupported("the file has no video stream")
        stream = self.container.streams.video[0]
        if stream.codec_context is None:
            raise _Unsupported("its codec is unknown to PyAV's FFmpeg, which has no decoder for it")
        return stream

    def span(self, queries: np.ndarray, tolerance_s: float) -> _Span:
        first, last = float(queries.min()), float(queries.max())
        # Seeking to first + tolerance (rather than LeRobot's first - 1 tick) lands on the first
        # query's own keyframe instead of the GOP before it; it finds the same frames as long as
        # frames are more than 2 x tolerance_s apart.
        target = first + tolerance_s
        while True:
            seek_to = max(target - self.seek_lag, self.start)
            packets = self._packets_from(seek_to)
            head = next(packets, None)
            landed = self._seconds(head.pts) if head is not None and head.pts is not None else None
            if landed is None or landed <= target or seek_to <= self.start:
                return self._decode(itertools.chain([head], packets) if head is not None else packets, last)
            # The mp4 demuxer picks keyframes by decode time, which runs behind presentation time
            # when frames are reordered (HEVC's B frames): it landed past frames of the request.
            self.seek_lag = max(self.seek_lag + self.frame_s, landed - seek_to)

    def _packets_from(self, seconds: float) -> Iterator[Any]:
        """Packets from the keyframe at or before `seconds` (by the demuxer's index)."""
        self.container.seek(math.floor(seconds / self.time_base), backward=True, any_frame=False, stream=self.stream)
        return iter(self.container.demux(self.stream))

    def _decode(self, packets: Iterable[Any], last: float) -> _Span:
        times: list[float] = []
        frames: list[Any] = []
        decoded = 0
        for packet in packets:
            for frame in packet.decode():
                decoded += 1
                if frame.pts is None:
                    continue
                times.append(self._seconds(frame.pts))
                frames.append(frame)
                if times[-1] >= last:
                    return _Span(np.asarray(times), frames, at_end=False, decoded=decoded)
        return _Span(np.asarray(times, dtype=np.float64), frames, at_end=True, decoded=decoded)

    def _seconds(self, pts: int) -> float:
        return float(pts * self.time_base)

    def rgb(self, frame: Any) -> torch.Tensor:
        return torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)

    def close(self) -> None:
        self.container.close()


class _TorchCodecVideo:
    """A torchcodec decoder; it seeks by frame index (time x average fps), as LeRobot's does."""

    def __init__(self, path: Path, threads: int) -> None:
        decoder_class = torchcodec_decoder_class()
        self.decoder = decoder_class(str(path), seek_mode="approximate", num_ffmpeg_threads=threads)
        meta = self.decoder.metadata
        self.fps = float(meta.average_fps)
        self.num_frames = int(meta.num_frames)

    def span(self, queries: np.ndarray, tolerance_s: float) -> _Span:
        wanted = [round(float(q) * self.fps) for q in queries]
        indices = [min(max(i, 0), self.num_frames - 1) for i in wanted]
        batch = self.decoder.get_frames_at(indices=indices)
        times = np.asarray(batch.pts_seconds.tolist(), dtype=np.float64)
        return _Span(times, list(batch.data), at_end=max(wanted) >= self.num_frames, decoded=len(indices))

    def rgb(self, frame: Any) -> torch.Tensor:
        return frame if isinstance(frame, torch.Tensor) else torch.as_tensor(frame)

    def close(self) -> None:
        self.decoder = None


def torchcodec_decoder_class() -> Any:
    """torchcodec's VideoDecoder class, or a DatasetError saying why it cannot load here."""
    try:
        decoder_class = importlib.import_module("torchcodec.decoders").VideoDecoder
    except Exception as exc:  # ImportError when absent; RuntimeError/OSError when FFmpeg is missing
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(
            f"--dataset.video_backend=torchcodec: torchcodec cannot load here ({type(exc).__name__}: {reason}); "
            "it needs the torchcodec package built for this torch and a system FFmpeg; "
            "use --dataset.video_backend=pyav (PyAV bundles its own FFmpeg)"
        ) from None
    return decoder_class


class VideoDecoder:
    """Frames of video features by timestamp; one per process (see the module docstring)."""

    def __init__(
        self,
        backend: str = "pyav",
        *,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        threads: int = 1,
    ) -> None:
        if backend not in BACKENDS:
            raise DatasetError(f"--dataset.video_backend={backend}: unknown backend; choose one of {', '.join(BACKENDS)}")
        if backend == "torchcodec":
            torchcodec_decoder_class()
        if not tolerance_s >= 0:
            raise DatasetError(f"--dataset.tolerance_s={tolerance_s}: must be >= 0 seconds")
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be >= 1, got {max_open_files}")
        self.backend = backend
        self.tolerance_s = float(tolerance_s)
        self.max_open_files = max_open_files
        # One thread per decoder by default: a process per DataLoader worker already fills the
        # cores, and frame threading delays each frame's output, which random access pays for.
        self.threads = threads
        self.decoded_frames = 0  # frames the codecs produced, for tests and benchmarks
        self._files: OrderedDict[str, _OpenVideo] = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_files"] = OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def frames(self, path: str | os.PathLike[str], timestamps: Sequence[float] | np.ndarray, *, key: str, episode: int) -> torch.Tensor:
        """(N, C, H, W) float32 RGB in [0, 1]: the frame closest to each time (seconds in the file)."""
        path = Path(path)
        where = f"{path}: episode {episode}, feature {key!r}"
        queries = np.asarray(timestamps, dtype=np.float64).reshape(-1)
        if queries.size == 0:
            raise ValueError(f"{where}: no timestamps asked")
        if not np.isfinite(queries).all():
            raise DatasetError(f"{where}: query times {queries.tolist()} are not all finite; check the data file's timestamp column")
        video, span = self._decode(path, queries, key, where)
        picked = self._closest_frames(span, queries, key, where)
        rgb: dict[int, torch.Tensor] = {}
        for i in picked:
            if i not in rgb:
                rgb[i] = video.rgb(span.frames[i])
        return torch.stack([rgb[i] for i in picked]).to(torch.float32) / 255

    def close(self) -> None:
        """Close every open file (this process's only)."""
        self._adopt_process()
        while self._files:
            self._files.popitem(last=False)[1].close()

    def open_files(self) -> list[str]:
        """The files this process holds open, least recently used first."""
        self._adopt_process()
        return list(self._files)

    def _decode(self, path: Path, queries: np.ndarray, key: str, where: str) -> tuple[_OpenVideo, _Span]:
        errors = _pyav_errors()
        try:
            video = self._open(path, key, where)
            span = video.span(queries, self.tolerance_s)
        except DatasetError:
            raise
        except _Unsupported as exc:
            raise DatasetError(f"{where}: cannot decode this video: {exc}; re-encode it as AV1, H.264 or HEVC (yuv420p)") from None
        except errors as exc:
            self._forget(path)
            raise DatasetError(
                f"{where}: cannot decode the video ({_describe(exc)}); the file is corrupt or truncated: "
                "re-download the dataset or re-encode this file"
            ) from None
        self.decoded_frames += span.decoded
        return video, span

    def _open(self, path: Path, key: str, where: str) -> _OpenVideo:
        self._adopt_process()
        name = str(path)
        video = self._files.pop(name, None)
        if video is None:
            if not path.is_file():
                raise DatasetError(
                    f"{where}: video file missing; meta/episodes points this episode at it "
                    f"(videos/{key}/chunk_index and file_index): re-download the dataset or fix those columns"
                )
            video = _PyAVVideo(path, self.threads) if self.backend == "pyav" else _TorchCodecVideo(path, self.threads)
            while len(self._files) >= self.max_open_files:
                self._files.popitem(last=False)[1].close()
        self._files[name] = video
        return video

    def _forget(self, path: Path) -> None:
        # A decode error can leave the container mid-packet; the next request reopens it.
        video = self._files.pop(str(path), None)
        if video is not None:
            try:
                video.close()
            except Exception:  # closing a broken file must not hide the first error
                pass

    def _adopt_process(self) -> None:
        if self._pid != os.getpid():
            _INHERITED.extend(self._files.values())
            self._files = OrderedDict()
            self._pid = os.getpid()

    def _closest_frames(self, span: _Span, queries: np.ndarray, key: str, where: str) -> list[int]:
        if not span.times.size:
            raise DatasetError(
                f"{where}: no frame decodes at or after query time {queries.min():.6f} s; the video ends before it: "
                f"the file is truncated, or videos/{key}/from_timestamp in meta/episodes does not fit this file"
            )
        dist = np.abs(queries[:, None] - span.times[None, :])
        picked = dist.argmin(axis=1)
        off = dist[np.arange(queries.size), picked]
        bad = np.nonzero(off > self.tolerance_s)[0]
        if bad.size:
            self._refuse(span, float(queries[bad[0]]), float(span.times[picked[bad[0]]]), key, where)
        return [int(i) for i in picked]

    def _refuse(self, span: _Span, query: float, closest: float, key: str, where: str) -> None:
        if span.at_end and query > span.times[-1]:
            raise DatasetError(
                f"{where}: query time {query:.6f} s is past the end of the video (its last frame, the closest, is at "
                f"{closest:.6f} s); the data file's timestamps or videos/{key}/from_timestamp in meta/episodes do not "
                "fit this file, or the file is truncated: re-download or re-encode it "
                f"(--dataset.tolerance_s={self.tolerance_s:g} only absorbs small timestamp drift)"
            )
        raise DatasetError(
            f"{where}: no frame within --dataset.tolerance_s={self.tolerance_s:g} of query time {query:.6f} s "
            f"(closest frame at {closest:.6f} s, {abs(query - closest):.6g} s away); the data file's timestamps "
            "and the video disagree: raise --dataset.tolerance_s if that drift is expected, or re-encode the video"
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def decode_all(path: str | os.PathLike[str]) -> np.ndarray:
    """Every frame of a video as uint8 (N, H, W, 3) RGB, in presentation order (stats, tests)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])


def _encoder_options(codec: str, g: int, crf: int) -> dict[str, str]:
    options = {"g": str(g), "crf": str(crf)}
    if codec == "av1":
        # lp=1: the SVT-AV1 in PyAV's wheels deadlocks at random frames with its own thread pool
        # (every thread waiting in svt_av1_enc_send_picture, after 1,200-2,700 frames); one
        # level of parallelism changes the speed of writing, not the frames' decoding
        options.update({"preset": str(SVTAV1_PRESET), "svtav1-params": "fast-decode=0:lp=1"})
    elif codec == "hevc":
        # cutree=0: the x265 in PyAV's wheels corrupts its heap with cutree on frames this small
        # (48x40, 30x44: an abort); the flag only changes how bits are spread over frames.
        options["x265-params"] = "log-level=error:cutree=0"
    return options


def encode_video(
    frames: np.ndarray,
    path: str | os.PathLike[str],
    fps: int,
    *,
    codec: str = "av1",
    g: int = 2,
    crf: int = 30,
    pix_fmt: str = "yuv420p",
) -> Path:
    """Write uint8 (N, H, W, 3) RGB frames as an MP4 at `fps`, frame i at i / fps seconds."""
    import av

    if codec not in ENCODERS:
        raise ValueError(f"codec {codec!r}: choose one of {', '.join(ENCODERS)}")
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise ValueError(f"frames must be uint8 (N, H, W, 3) with N >= 1, got {frames.dtype} {frames.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    # SVT-AV1 prints its banner straight to stderr unless told otherwise.
    os.environ.setdefault("SVT_LOG", "1")
    try:
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream(ENCODERS[codec], rate=fps, options=_encoder_options(codec, g, crf))
            assert isinstance(stream, av.VideoStream)
            stream.pix_fmt = pix_fmt
            stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
            stream.time_base = Fraction(1, fps)
            for i, rgb in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts = i
                frame.time_base = Fraction(1, fps)
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
