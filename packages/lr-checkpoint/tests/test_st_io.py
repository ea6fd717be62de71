"""The safetensors writer and resume's reader: the bytes they hash are the bytes on disk,
and every dtype, shape and alignment reads back equal."""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lr_checkpoint import CheckpointError
from lr_checkpoint._formats.safetensors.read import read_tensors
from lr_checkpoint._formats.safetensors.write import write_tensor_dict
from lr_checkpoint._io.checksums import ChecksumCheck, _chunks, _digest, write_checksums
from lr_checkpoint._io.hashing import StreamHasher


def mixed() -> dict[str, torch.Tensor]:
    # a 3-byte uint8 tensor sorts first, so the float tensors after it start at odd offsets
    return {
        "a_odd": torch.tensor([1, 2, 3], dtype=torch.uint8),
        "b_f32": torch.randn(5, 7),
        "c_bf16": torch.randn(4, 3).to(torch.bfloat16),
        "d_bool": torch.tensor([True, False, True]),
        "e_scalar": torch.tensor(2.5, dtype=torch.float64),
        "f_empty": torch.empty(0, 4),
        "g_i64": torch.arange(6).reshape(2, 3),
    }


def test_the_writer_returns_the_sha256_and_crc32_of_the_file_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    digest = write_tensor_dict(path, mixed(), {"format": "pt"})
    data = path.read_bytes()
    assert digest.size == len(data)
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    assert digest.crc32 == f"{zlib.crc32(data):08x}"


def test_the_crc32_is_the_stdlib_one_so_checksums_written_before_stay_valid() -> None:
    # the CRC-32 comes from zlib-ng; an lr that used the stdlib's zlib wrote the same values
    data = os.urandom((3 << 20) + 7)
    sizes = [1, 4095, 1 << 20, 13, 2 << 20]
    hasher, at = StreamHasher(), 0
    for size in sizes:
        hasher.update(data[at : at + size])
        at += size
    hasher.update(data[at:])
    digest = hasher.digest()
    assert digest.size == len(data)
    assert digest.crc32 == f"{zlib.crc32(data):08x}"
    assert digest.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("size", [0, 1, mmap.ALLOCATIONGRANULARITY, 3 * mmap.ALLOCATIONGRANULARITY + 7])
def test_a_file_digest_through_mapped_windows_is_the_digest_of_its_bytes(tmp_path: Path, size: int) -> None:
    # one window of the allocation granularity: a file of several windows and a short last one
    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    expected = (size, hashlib.sha256(data).hexdigest(), f"{zlib.crc32(data):08x}")
    for window in (mmap.ALLOCATIONGRANULARITY, 32 << 20):
        digest = _digest(path, window=window)
        assert (digest.size, digest.sha256, digest.crc32) == expected
        crc_only = _digest(path, sha256=False, window=window)
        assert (crc_only.size, crc_only.sha256, crc_only.crc32) == (size, "", expected[2])


def test_a_file_shorter_than_its_size_at_open_is_read_to_its_end(tmp_path: Path) -> None:
    # the size taken at open promises more windows than the file now has (it was truncated after
    # its size was taken): the window past the end cannot be mapped, so the rest is read, and
    # the bytes hashed are the ones the file holds
    granule = mmap.ALLOCATIONGRANULARITY
    path = tmp_path / "f.bin"
    data = os.urandom(2 * granule + 100)
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as f:
        pieces = [(bytes(chunk), type(chunk.obj)) for chunk in _chunks(f, 5 * granule, granule)]
    assert b"".join(p for p, _ in pieces) == data
    # two maps of the page cache, then the read of the rest into a buffer
    assert [(len(p), kind) for p, kind in pieces] == [(granule, mmap.mmap), (granule, mmap.mmap), (100, bytearray)]


def test_the_reader_gives_back_every_tensor_and_the_file_digest(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    tensors = mixed()
    save_file(tensors, str(path))  # written by safetensors itself, not by our writer
    got, digest = read_tensors(path)
    assert digest is not None and digest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest.crc32 == f"{zlib.crc32(path.read_bytes()):08x}"
    crc_only = read_tensors(path, sha256=False)[1]  # resume's check
    assert crc_only is not None and crc_only.sha256 == "" and crc_only.crc32 == digest.crc32
    reference = load_file(str(path))
    assert got.keys() == reference.keys()
    for name, tensor in reference.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
    assert read_tensors(path, hash_it=False)[1] is None
    # a 0-dim tensor owns its storage: torch pickles those to broadcast them
    assert got["e_scalar"].untyped_storage().nbytes() == 8


def test_the_reader_names_a_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    save_file(mixed(), str(path))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)
    with pytest.raises(CheckpointError, match=r"x\.safetensors: truncated"):
        read_tensors(path)


def test_a_digest_taken_while_reading_stands_for_the_file(tmp_path: Path) -> None:
    """Resume's check: a file the loader hashed as it read it is compared with its recorded
    digest, not read again; the others are hashed in the background."""
    root = tmp_path / "step"
    root.mkdir()
    write_tensor_dict(root / "model.safetensors", {"w": torch.ones(3)})
    (root / "other.json").write_text("{}\n")
    write_checksums(root)

    check = ChecksumCheck(root, read_by_main=[root / "model.safetensors"])
    _, digest = read_tensors(root / "model.safetensors")
    assert digest is not None
    check.record(root / "model.safetensors", digest)
    check.finish()

    # a recorded digest that differs is reported, naming the file
    check = ChecksumCheck(root, read_by_main=[root / "model.safetensors"])
    assert not check.needs_sha256(root / "model.safetensors")  # the CRC-32 is enough
    check.record(root / "model.safetensors", type(digest)(size=digest.size, sha256="", crc32="0" * 8))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: its bytes differ from the save"):
        check.finish()

    # a file named in read_by_main that the loader never read is hashed at finish
    (root / "model.safetensors").write_bytes(b"x" * digest.size)
    check = ChecksumCheck(root, read_by_main=[root / "model.safetensors"])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: its bytes differ from the save"):
        check.finish()


def test_the_reader_fills_fitting_tensors_in_place(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    tensors = mixed()
    save_file(tensors, str(path))
    live = {"b_f32": torch.zeros(5, 7), "c_bf16": torch.zeros(4, 2, dtype=torch.bfloat16), "g_i64": torch.zeros(2, 3)}
    got, _ = read_tensors(path, into=live)
    assert got["b_f32"] is live["b_f32"] and torch.equal(live["b_f32"], tensors["b_f32"])  # read into its memory
    assert got["c_bf16"] is not live["c_bf16"] and torch.equal(got["c_bf16"], tensors["c_bf16"])  # another shape
    assert got["g_i64"] is not live["g_i64"] and torch.equal(got["g_i64"], tensors["g_i64"])  # another dtype
    assert not live["g_i64"].any()


def test_the_direct_dcp_reader_matches_dcp_own_reader(tmp_path: Path) -> None:
    """Resume's DCP reader reads stored tensor bytes straight into their destination; what it
    loads equals what DCP's own reader loads, for every dtype, a view with a storage offset,
    a transposed tensor (DCP's path), a destination of another dtype (copied), and archives
    small enough to be read whole with their first bytes and bigger ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from lr_checkpoint._formats.dcp.direct import DirectFileSystemReader

    base = torch.arange(100, dtype=torch.float32)
    state = {
        "a": torch.randn(6, 5),
        "b": torch.randn(4, 3).to(torch.bfloat16),
        "c": torch.tensor(3.0),
        "view": base[10:40].view(5, 6),
        "transposed": torch.randn(3, 4).t(),
        "ints": torch.arange(7),
        "bools": torch.tensor([True, False]),
        # archives over 4 KiB: read front to back (the tensor's bytes, then the directory)
        "big": torch.randn(64, 40),
        "big bf16": torch.randn(50, 70).to(torch.bfloat16),
        "big view": torch.arange(9000, dtype=torch.float32)[2000:5000].view(60, 50),
    }
    with pytest.warns(UserWarning, match="torch.distributed"):
        dcp.save(state, storage_writer=FileSystemWriter(tmp_path), no_dist=True)

    def load(reader: type[FileSystemReader], floating: torch.dtype | None) -> dict[str, torch.Tensor]:
        out = {k: torch.zeros(v.shape, dtype=floating if floating and v.is_floating_point() else v.dtype) for k, v in state.items()}
        with pytest.warns(UserWarning, match="torch.distributed"):
            dcp.load(out, storage_reader=reader(tmp_path), no_dist=True)
        return out

    for floating in (None, torch.float64):
        theirs, ours = load(FileSystemReader, floating), load(DirectFileSystemReader, floating)
        for key, tensor in state.items():
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
            assert torch.equal(ours[key].to(tensor.dtype), tensor), key


class _OpensAFile:
    """Unpickled by a trusting reader, it creates `path` (builtins.open)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def test_the_direct_reader_never_runs_a_hostile_item_pickle(tmp_path: Path) -> None:
    """A DCP item whose `data.pkl` carries a payload: the direct reader's restricted unpickler
    refuses it (the item is left to DCP's own `weights_only` loader), nothing runs; a trusting
    pickle.loads of the same bytes does run it."""
    import io
    import pickle

    from lr_checkpoint._formats.torch_save import locate

    genuine = io.BytesIO()
    torch.save(torch.zeros(4), genuine)
    tensor_pickle = bytes(torch._C.PyTorchFileReader(io.BytesIO(genuine.getvalue())).get_record("data.pkl"))
    marker = tmp_path / "ran"
    payload = pickle.dumps(_OpensAFile(marker), protocol=2)

    def item(data_pkl: bytes) -> Path:
        blob = io.BytesIO()
        writer = torch._C.PyTorchFileWriter(blob)
        writer.write_record("data.pkl", data_pkl, len(data_pkl))
        writer.write_record("byteorder", b"little", 6)
        writer.write_record("data/0", b"\0" * 16, 16)
        writer.write_end_of_file()
        path = tmp_path / "item.distcp"
        path.write_bytes(b"x" * 5 + blob.getvalue())  # an item at offset 5 of its shard file
        return path

    with open(item(tensor_pickle), "rb", buffering=0) as f:
        found = locate(f.fileno(), 5, os.path.getsize(f.name) - 5)  # control: the same archive with a tensor's data.pkl
    assert found is not None and found.dtype == "float32" and found.shape == (4,)
    with open(item(payload), "rb", buffering=0) as f:
        assert locate(f.fileno(), 5, os.path.getsize(f.name) - 5) is None
    assert not marker.exists()
    pickle.loads(payload)  # control: the payload is live
    assert marker.exists()
