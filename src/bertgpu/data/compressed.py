"""Compressed corpus files: gzip, bzip2 and zstd streams opened by their first bytes and their
suffix, read on the fly, and what a damaged stream looks like.

    with open_binary(Path("news.txt.gz")) as f: ...   # the decompressed bytes, streamed
    damage = check_rest(src, f)                        # after bad text: is the stream itself bad?

Compression (gzip, bzip2, zstd) is detected by the file's first bytes and its suffix (.gz, .bz2,
.zst): a compressed file named like a plain one is still read, and a file named .gz that is not
a gzip stream is an error. A corrupt or truncated compressed stream names the file
(`read_errors`; zstd's truncation is found by `ZstdFrames`, since zstandard's reader ends
quietly). gzip and bzip2 check their CRC only at the end of a member or block, so a damaged
stream can first decompress into text that fails to parse; `check_rest` reads on to find the
damage, which is then what is reported (`corpus`). A file in another compression (xz, 7z) or
an archive (zip, tar, also compressed) is refused by its first bytes, in one line: it would
otherwise be decoded as text.
"""

from __future__ import annotations

import bz2
import gzip
import io
import sys
import zlib
from typing import BinaryIO

from bertgpu.data.sources import Source, name_of, open_raw
from bertgpu.errors import BertgpuError

SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}
_BZ2_BLOCKS = (b"1AY&SY", b"\x17rE8P\x90")  # after "BZh1".."BZh9": a block, or the empty stream


def compression_suffix(name: str) -> str | None:
    """The compression suffix a file name ends with (".gz", ...), or None."""
    lower = name.lower()
    return next((s for s in SUFFIXES if lower.endswith(s)), None)


def sniff_compression(head: bytes) -> str | None:
    """"gzip", "bz2" or "zstd" from a stream's first 10 bytes, or None for anything else. A zstd
    stream may start with a skippable frame (magic 0x184D2A50 to 0x184D2A5F): pzstd writes one
    before each frame, and its files were refused as "not a zstd stream"."""
    if head[:3] == b"\x1f\x8b\x08":
        return "gzip"
    if head[:4] == b"\x28\xb5\x2f\xfd" or (head[1:4] == b"\x2a\x4d\x18"
                                          and head[0] & 0xF0 == 0x50):
        return "zstd"
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in _BZ2_BLOCKS:
        return "bz2"
    return None


def compression_of(src: Source, head: bytes) -> str | None:
    """The file's compression from its first bytes, checked against its suffix."""
    found = sniff_compression(head)
    suffix = compression_suffix(name_of(src))
    if suffix is not None and found is None:
        raise BertgpuError(f"{src}: named {suffix} but not a {SUFFIXES[suffix]} stream (it starts "
                           f"with {head[:4]!r}); expected a {SUFFIXES[suffix]} file")
    return found


def _peek(raw: BinaryIO, n: int) -> bytes:
    if hasattr(raw, "peek"):
        return raw.peek(n)[:n]
    if raw.seekable():
        head = raw.read(n)
        raw.seek(0)
        return head
    return b""  # a stream that cannot look ahead: decided by the suffix alone


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged file raises: OS errors, truncated streams (EOFError), zlib's and
    zstandard's own errors (neither is an OSError)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    zstd = sys.modules.get("zstandard")
    return errors + (zstd.ZstdError,) if zstd is not None else errors


class _Decompressed(io.BufferedReader):
    """A decompressing reader that also closes the stored file under it; ``kind``: "gzip",
    "bz2" or "zstd"."""

    def __init__(self, reader, raw: BinaryIO, kind: str) -> None:
        super().__init__(reader, buffer_size=1 << 16)
        self._under = raw
        self.kind = kind

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._under.close()


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = 0x184D2A50  # ... to 0x184D2A5F: a skippable frame (4-byte size, then its bytes)


class ZstdFrames(io.RawIOBase):
    """The stored bytes of a zstd file, passed through unchanged while their frame structure is
    followed, so that a stream cut short is an error (EOFError, like gzip's and bz2's).

    zstandard's stream reader ends quietly where the bytes end, even inside a frame: a file cut
    at 70% gave the first 69% of its text. Here each frame's header, block headers (3 bytes:
    last-block flag, type, size) and checksum are walked as the bytes go by (RFC 8878 section
    3.1), which costs a few operations per block of up to 128 KiB; at the end of the file the
    walk must stand between frames, after at least one.
    """

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self.raw = raw
        self.pos = 0  # bytes passed on
        self.frames = 0  # frames begun
        self.want = 4  # bytes of the next header field to gather into `head` ...
        self.head = b""
        self.skip = 0  # ... after skipping this many bytes of content
        self.state = "magic"
        self.flags = 0  # the frame header descriptor of the current frame
        self.known = True  # False after bytes that are not a frame: left to the decompressor

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        if not data:
            self._check_end()
            return 0
        n = len(data)
        buffer[:n] = data
        if self.known:
            self._walk(memoryview(data))
        self.pos += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            super().close()

    def _walk(self, data: memoryview) -> None:
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                step = min(self.skip, n - i)
                self.skip -= step
                i += step
                continue
            step = min(self.want - len(self.head), n - i)
            self.head += bytes(data[i : i + step])
            i += step
            if len(self.head) == self.want:
                field, self.head = self.head, b""
                self._field(field)
                if not self.known:
                    return

    def _field(self, field: bytes) -> None:
        """The next field of the walk is complete: decide what follows it."""
        value = int.from_bytes(field, "little")
        if self.state == "magic":
            if value == _ZSTD_MAGIC:
                self.state, self.want = "descriptor", 1
            elif value & 0xFFFFFFF0 == _SKIPPABLE:
                self.state, self.want = "skippable", 4
            else:
                self.known = False  # not a frame: the decompressor reports it
                return
            self.frames += 1
        elif self.state == "skippable":
            self.state, self.want, self.skip = "magic", 4, value
        elif self.state == "descriptor":
            self.flags = value
            single = value >> 5 & 1
            content_size = (single, 2, 4, 8)[value >> 6]
            self.state, self.want = "block", 3
            self.skip = (1 - single) + (0, 1, 2, 4)[value & 3] + content_size
        elif self.state == "block":
            last, kind, size = value & 1, value >> 1 & 3, value >> 3
            self.skip = 1 if kind == 1 else size  # an RLE block stores one byte
            if last:
                self.state, self.want = "magic", 4
                self.skip += 4 if self.flags >> 2 & 1 else 0  # the content checksum

    def _check_end(self) -> None:
        between = self.state == "magic" and not self.head and not self.skip
        if self.known and not (between and self.frames):
            raise EOFError(f"truncated zstd stream: the file ends at byte {self.pos}, inside "
                           f"frame {self.frames}; expected a complete zstd file")


SUPPORTED = "expected plain text, gzip, bzip2 or zstd"
"""What the readers take, as the README lists it."""
_UNSUPPORTED = ((b"\xfd7zXZ\x00", "xz-compressed"), (b"7z\xbc\xaf\x27\x1c", "7z-compressed"),
                (b"PK\x03\x04", "a zip archive"))
TAR_PEEK = 512
"""Bytes of a file's (decompressed) start looked at for a tar header (`check_not_tar`)."""


def check_stored(src: Source, head: bytes) -> None:
    """Refuse a file whose stored first bytes (``head``) are a compression or an archive that
    is not read (they would be decoded as text, and fail as "invalid UTF-8")."""
    for magic, what in _UNSUPPORTED:
        if head.startswith(magic):
            raise BertgpuError(f"{src}: {what}: not supported; {SUPPORTED}")


def check_not_tar(src: Source, head: bytes) -> None:
    """Refuse a tar archive (``head``: its decompressed first bytes), which would be read as
    text, headers and all. A NUL byte is no sign of one: text may hold it (a control character
    BERT's normaliser removes), and binary files fail as invalid UTF-8 soon enough."""
    if head[257:262] == b"ustar":  # in the first file's 512-byte header (POSIX and GNU tar)
        raise BertgpuError(f"{src}: a tar archive; expected text (extract it first)")


def open_binary(src: Source, check: bool = True) -> BinaryIO:
    """Open a file for streaming bytes, decompressing gzip / bzip2 / zstd on the fly; a file
    that is an archive or in a compression that is not read is refused (`check_stored`,
    `check_not_tar`) unless ``check`` is False (a look at its first bytes, whose reader will
    refuse it where --skip-bad applies)."""
    raw = open_raw(src)
    try:
        head = _peek(raw, TAR_PEEK)
        if check:
            check_stored(src, head)
        kind = compression_of(src, head[:10])
        if kind is None and compression_suffix(name_of(src)) is None:
            if check:
                check_not_tar(src, head)
            return raw
        kind = kind or SUFFIXES[compression_suffix(name_of(src))]  # type: ignore[index]
    except BaseException:
        raw.close()
        raise
    f = _decompress(src, raw, kind)
    if not check:
        return f
    try:
        head = f.peek(TAR_PEEK)[:TAR_PEEK]
    except read_errors():  # damage: read again without the check, to find it where `corpus` does
        f.close()
        return _decompress(src, open_raw(src), kind)
    except BaseException:
        f.close()
        raise
    try:
        check_not_tar(src, head)
    except BertgpuError:
        f.close()
        raise
    return f


def _decompress(src: Source, raw: BinaryIO, kind: str) -> BinaryIO:
    """A reader of the decompressed bytes of ``raw`` (closed with it)."""
    try:
        if kind == "gzip":
            return _Decompressed(gzip.GzipFile(fileobj=raw, mode="rb"), raw, kind)
        if kind == "bz2":
            return _Decompressed(bz2.BZ2File(raw, "rb"), raw, kind)
        try:
            import zstandard
        except ImportError:
            raise BertgpuError(f"{src}: zstd-compressed; reading it needs zstandard, expected "
                               "`pip install 'bertgpu[zstd]'`") from None
        framed = ZstdFrames(raw)
        reader = zstandard.ZstdDecompressor().stream_reader(framed, read_across_frames=True,
                                                            closefd=False)
        return _Decompressed(reader, framed, kind)
    except BaseException:
        raw.close()
        raise


CHECK_BYTES = 64 << 20
"""After bad text in a compressed file, at most this many more decompressed bytes are read to
find damage to the stream: a bad JSON line near the start of a 20 GB file is not worth
decompressing all of it (gzip, the slowest to reach its check, does ~300 MB/s; bzip2 ~20)."""
_NAMES = {"gzip": "gzip", "bz2": "bzip2", "zstd": "zstd"}


def check_rest(src: Source, f: BinaryIO, error: BertgpuError) -> BertgpuError:
    """What to report for bad text (``error``) found in the stream ``f`` of ``src``.

    Uncompressed, ``error``. Compressed, the stream is read on: damage found there (a CRC
    mismatch, a stream cut short, a decompression error) is the cause, and reported as
    "SRC: damaged gzip stream (...)"; a stream intact to its end leaves ``error`` (the text is
    bad); one longer than CHECK_BYTES more is not read to its end, and ``error`` then says that
    its line is in the decompressed text and how to check the stream.
    """
    kind = getattr(f, "kind", None)
    if kind is None:
        return error
    name = _NAMES[kind]
    try:
        left = CHECK_BYTES
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                return error
            left -= len(block)
    except read_errors() as exc:
        detail = " ".join(str(exc).split())
        if isinstance(exc, OSError) and exc.errno is not None:  # the disk, not the stream
            return BertgpuError(f"{src}: cannot read ({detail})")
        what = str(error).removeprefix(f"{src}:").split("; expected", 1)[0].strip()
        where = f"line {what}" if what[:1].isdigit() else what
        return BertgpuError(f"{src}: damaged {name} stream ({detail}); the bad text found before "
                            f"it ({where}) is what the damage decompressed to; expected an intact "
                            f"{name} file (`{name} -t` checks one)")
    return BertgpuError(f"{error} (a line of the {name}-decompressed text; the stream was not "
                        f"read to its end to look for damage: `{name} -t {src}` checks it)")
