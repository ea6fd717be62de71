"""Video features: lr decodes what LeRobot 0.6.1's loader decodes, seeks instead of decoding from the
file's start, names file, episode and feature in every error, and works in DataLoader workers."""

from __future__ import annotations

import importlib
import json
import os
import pickle
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from lr_engine._data.demo import make_demo_dataset
from lr_engine._data.errors import DatasetError
from lr_engine._data.video import VideoDecoder, decode_all, encode_video
from safetensors import safe_open
from safetensors.torch import load_file

REFERENCE = Path(__file__).parent / "data" / "lerobot_reference"
KEY = "observation.images.top"
FPS = 10


def _scene(n: int, height: int, width: int, camera: int) -> np.ndarray:
    """Smooth frames (lossy codecs keep them) that differ clearly from one frame to the next."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((n, height, width, 3), np.uint8)
    for i in range(n):
        cx = (i * 3 + 7 * camera) % width
        blob = 150.0 * np.exp(-((xx - cx) ** 2 + (yy - height / 2) ** 2) / 40.0)
        frames[i, ..., 0] = np.clip(40 + 6 * i + blob, 0, 255)
        frames[i, ..., 1] = np.clip(90 + 60 * camera + 0.5 * blob, 0, 255)
        frames[i, ..., 2] = np.clip(200 - 5 * i, 0, 255)
    return frames


def _uint8_hwc(frames: torch.Tensor) -> np.ndarray:
    return (frames * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


# --- LeRobot's own reference ------------------------------------------------------------------


def _lerobot_query(root: Path, index: int) -> tuple[Path, float, int]:
    """Video file and query time of dataset frame `index`, computed as LeRobot's loader does."""
    info = json.loads((root / "meta" / "info.json").read_text())
    episodes = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    ep = int(data["episode_index"][index])
    chunk, file = episodes[f"videos/{KEY}/chunk_index"][ep], episodes[f"videos/{KEY}/file_index"][ep]
    path = root / info["video_path"].format(video_key=KEY, chunk_index=chunk, file_index=file)
    return path, episodes[f"videos/{KEY}/from_timestamp"][ep] + float(data["timestamp"][index]), ep


def test_decodes_the_pixels_lerobot_0_6_1_returns() -> None:
    reference = REFERENCE / "dataset_pointmass_video_decoded.safetensors"
    with safe_open(str(reference), "pt") as f:
        indices = json.loads(f.metadata()["indices"])
    expected = load_file(str(reference))
    decoder = VideoDecoder()
    worst = 0
    for index in indices:
        path, query, ep = _lerobot_query(REFERENCE / "dataset_pointmass_video", index)
        frame = decoder.frames(path, [query], key=KEY, episode=ep)
        assert frame.dtype == torch.float32 and tuple(frame.shape) == (1, 3, 48, 64)
        ours = (frame[0] * 255).round().to(torch.uint8)
        worst = max(worst, int((ours.int() - expected[f"frame_{index}"].int()).abs().max()))
    assert worst <= 1, f"max pixel difference to LeRobot's loader: {worst}"


# --- round trips, seeking, several cameras ----------------------------------------------------


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc"])
def test_round_trip_two_cameras_at_an_odd_size(tmp_path: Path, codec: str) -> None:
    n, height, width = 24, 30, 44
    sources = {cam: _scene(n, height, width, cam) for cam in range(2)}
    paths = {cam: encode_video(frames, tmp_path / f"cam{cam}.mp4", FPS, codec=codec) for cam, frames in sources.items()}
    decoder = VideoDecoder()
    order = np.random.default_rng(0).permutation(n)
    for cam, path in paths.items():
        with av.open(str(path)) as container:
            assert container.streams.video[0].codec_context.name in {"av1": ("libdav1d", "av1"), "h264": ("h264",), "hevc": ("hevc",)}[codec]
        decoded = np.concatenate([_uint8_hwc(decoder.frames(path, [i / FPS], key=f"cam{cam}", episode=0)) for i in order])
        source = sources[cam][order].astype(np.float32)
        assert decoded.shape == (n, height, width, 3)
        assert np.abs(decoded - source).mean() < 6.0  # lossy, but close
        # Each decoded frame is nearest to its own source frame: timestamps map to the right frames.
        distance = np.abs(decoded[:, None].astype(np.float32) - source[None]).mean(axis=(2, 3, 4))
        assert (distance.argmin(axis=1) == np.arange(n)).all()
        # Random access equals a straight decode of the whole file.
        assert (decoded == decode_all(path)[order]).all()
    # A frame and its keyframe at most, per request (the first request per file may seek twice).
    assert decoder.decoded_frames <= 2 * n * 2 + 4


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc"])
def test_seeks_to_the_keyframe_instead_of_decoding_from_the_start(tmp_path: Path, codec: str) -> None:
    path = encode_video(_scene(200, 30, 44, 0), tmp_path / "long.mp4", FPS, codec=codec, g=2)
    decoder = VideoDecoder()
    decoder.frames(path, [10.0], key=KEY, episode=0)  # learns how the file seeks
    before = decoder.decoded_frames
    frames = decoder.frames(path, [15.1, 15.3], key=KEY, episode=0)
    assert frames.shape == (2, 3, 30, 44)
    # From the keyframe at 15.0 s to 15.3 s: 4 frames. Decoding from the file's start: 154.
    assert decoder.decoded_frames - before <= 5


def test_open_files_are_kept_and_bounded(tmp_path: Path) -> None:
    paths = [encode_video(_scene(6, 30, 44, cam), tmp_path / f"cam{cam}.mp4", FPS) for cam in range(3)]
    decoder = VideoDecoder(max_open_files=2)
    first = decoder.frames(paths[0], [0.3], key=KEY, episode=0)
    for path in paths:
        decoder.frames(path, [0.2], key=KEY, episode=0)
    assert decoder.open_files() == [str(paths[1]), str(paths[2])]
    assert torch.equal(decoder.frames(paths[0], [0.3], key=KEY, episode=0), first)
    decoder.close()
    assert decoder.open_files() == []


def test_demo_video_dataset_has_lerobots_layout(tmp_path: Path) -> None:
    root = make_demo_dataset(tmp_path / "ds", num_episodes=2, with_images=True, video=True, cameras=("top", "wrist"), image_height=30, image_width=44)
    info = json.loads((root / "meta" / "info.json").read_text())
    stats = json.loads((root / "meta" / "stats.json").read_text())
    episodes = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    decoder = VideoDecoder()
    for key in ("observation.images.top", "observation.images.wrist"):
        feat = info["features"][key]
        assert feat["dtype"] == "video" and feat["shape"] == [30, 44, 3]
        assert {"video.height": 30, "video.width": 44, "video.codec": "av1", "video.pix_fmt": "yuv420p", "video.g": 2}.items() <= feat["info"].items()
        assert key not in data
        assert np.asarray(stats[key]["mean"]).shape == (3, 1, 1)
        path = root / info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        whole = decode_all(path)
        assert len(whole) == len(data["index"]) == stats[key]["count"][0]
        assert episodes[f"videos/{key}/to_timestamp"][0] == episodes[f"videos/{key}/from_timestamp"][1] == episodes["length"][0] / FPS
        for i in (0, len(data["index"]) - 1):
            ep = data["episode_index"][i]
            query = episodes[f"videos/{key}/from_timestamp"][ep] + data["timestamp"][i]
            assert (_uint8_hwc(decoder.frames(path, [query], key=key, episode=ep))[0] == whole[i]).all()
    top, wrist = (decode_all(root / info["video_path"].format(video_key=k, chunk_index=0, file_index=0)) for k in ("observation.images.top", "observation.images.wrist"))
    assert np.abs(top.astype(int) - wrist.astype(int)).mean() > 10  # two different views


# --- every problem names the file, the episode and the feature --------------------------------


@pytest.fixture(scope="module")
def good_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return encode_video(_scene(20, 30, 44, 0), tmp_path_factory.mktemp("video") / "file-000.mp4", FPS)


def _expect_error(path: Path, query: float, *needles: str, decoder: VideoDecoder | None = None) -> str:
    with pytest.raises(DatasetError) as err:
        (decoder or VideoDecoder()).frames(path, [query], key=KEY, episode=7)
    message = str(err.value)
    for needle in (str(path), "episode 7", repr(KEY), *needles):
        assert needle in message, message
    return message


def test_missing_file(tmp_path: Path) -> None:
    _expect_error(tmp_path / "videos" / "file-000.mp4", 0.0, "missing", f"videos/{KEY}/chunk_index")


def test_truncated_file(tmp_path: Path, good_video: Path) -> None:
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(good_video.read_bytes()[: good_video.stat().st_size // 2])
    _expect_error(cut, 0.5, "corrupt or truncated")


def test_truncated_file_with_its_index_first_decodes_fewer_frames(tmp_path: Path, good_video: Path) -> None:
    """With the index (moov) before the frames, a cut file opens and simply ends early."""
    faststart = tmp_path / "faststart.mp4"
    with av.open(str(good_video)) as src, av.open(str(faststart), "w", format="mp4", options={"movflags": "faststart"}) as dst:
        out = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = out
                dst.mux(packet)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(faststart.read_bytes()[: faststart.stat().st_size * 2 // 3])
    assert VideoDecoder().frames(cut, [0.1], key=KEY, episode=7).shape == (1, 3, 30, 44)
    _expect_error(cut, 1.9, "truncated")


def test_corrupt_bytes(tmp_path: Path, good_video: Path) -> None:
    noise = tmp_path / "noise.mp4"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, good_video.stat().st_size, dtype=np.uint8).tobytes())
    _expect_error(noise, 0.0, "corrupt or truncated")
    # Intact index, garbage frames: the error comes from the codec, mid-decode.
    data = bytearray(good_video.read_bytes())
    start, end = data.find(b"mdat") + 4, data.find(b"moov") - 4
    data[start:end] = np.random.default_rng(1).integers(0, 256, end - start, dtype=np.uint8).tobytes()
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(bytes(data))
    decoder = VideoDecoder()
    _expect_error(garbage, 0.0, "corrupt or truncated", decoder=decoder)
    assert decoder.open_files() == []  # dropped: the next request reopens it
    assert decoder.frames(good_video, [0.0], key=KEY, episode=7).shape == (1, 3, 30, 44)


def test_unknown_codec(tmp_path: Path, good_video: Path) -> None:
    unknown = tmp_path / "unknown.mp4"
    unknown.write_bytes(good_video.read_bytes().replace(b"av01", b"zz99"))
    _expect_error(unknown, 0.0, "codec", "re-encode")


def test_timestamp_past_the_end(good_video: Path) -> None:
    message = _expect_error(good_video, 5.0, "past the end", "5.000000", "1.900000", "--dataset.tolerance_s")
    assert f"videos/{KEY}/from_timestamp" in message


def test_timestamp_off_by_more_than_the_tolerance(good_video: Path) -> None:
    message = _expect_error(good_video, 0.73, "--dataset.tolerance_s", "0.730000", "0.700000")
    assert "past the end" not in message
    # The same drift passes with a looser tolerance, and picks the closest frame.
    loose = VideoDecoder(tolerance_s=0.05).frames(good_video, [0.73], key=KEY, episode=7)
    assert torch.equal(loose, VideoDecoder().frames(good_video, [0.7], key=KEY, episode=7))


def test_torchcodec_that_cannot_load_says_to_use_pyav() -> None:
    try:
        importlib.import_module("torchcodec.decoders")
    except Exception:
        pass
    else:
        pytest.skip("torchcodec loads on this machine")
    with pytest.raises(DatasetError, match="--dataset.video_backend=pyav"):
        VideoDecoder("torchcodec")
    with pytest.raises(DatasetError, match="--dataset.video_backend=av"):
        VideoDecoder("av")


# --- DataLoader workers -----------------------------------------------------------------------


class _Frames(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A trivial dataset: one decoder, created with the dataset, used in whichever process reads."""

    def __init__(self, requests: list[tuple[Path, float]]) -> None:
        self.requests = requests
        # FFmpeg's own thread count: a worker that used the parent's decoders would wait forever
        # on decoder threads that exist only in the parent.
        self.decoder = VideoDecoder(threads=0)

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, query = self.requests[i]
        return self.decoder.frames(path, [query], key=KEY, episode=0)[0], os.getpid()


def test_decoder_in_dataloader_workers(tmp_path: Path) -> None:
    paths = [encode_video(_scene(20, 30, 44, cam), tmp_path / f"cam{cam}.mp4", FPS) for cam in range(2)]
    rng = np.random.default_rng(0)
    dataset = _Frames([(paths[int(rng.integers(2))], int(rng.integers(20)) / FPS) for _ in range(16)])
    # Decode in this process first: the workers inherit open files and must not use them.
    in_process = torch.stack([dataset[i][0] for i in range(len(dataset))])
    assert dataset.decoder.open_files()
    assert pickle.loads(pickle.dumps(dataset.decoder)).open_files() == []
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, timeout=60)
    batches = list(loader)
    in_workers = torch.cat([frames for frames, _ in batches])
    pids = {int(p) for _, pid in batches for p in pid}
    assert os.getpid() not in pids and len(pids) == 2
    assert torch.equal(in_workers, in_process)
    assert torch.equal(torch.stack([dataset[i][0] for i in range(len(dataset))]), in_process)

