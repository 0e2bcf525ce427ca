"""A ``multipart/form-data`` body (OpenAI's file uploads) read as it arrives, into memory, with
limits: ``read_form`` gives the form's text fields and its one file.

Not Starlette's ``request.form()``: that spools a file over 1 MB to a temporary file on disk
and applies no limit to a file's size, so a 2 GB upload would be written out before anything
could refuse it. Here the declared length is checked before the first byte is read, every part
is counted as it streams in (an over-limit file is refused at the byte that crosses the limit;
uvicorn then drops the rest of the body it still receives), and nothing touches the disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from switchboard.gateway.errors import APIError, bad_request

MAX_FIELD_BYTES = 64 * 1024  # a text field (model, language, prompt...): far more than any needs
MAX_PARTS = 32
FORM_OVERHEAD_BYTES = 1 << 20  # the body's parts besides the file: boundaries, headers, fields


@dataclass
class Upload:
    """A form's fields (each name's values in order: ``include[]`` may come several times) and its file."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    file: bytes | None = None
    file_field: str | None = None  # the name of the part that carried the file
    filename: str | None = None
    content_type: str | None = None  # the file part's own Content-Type

    def value(self, name: str) -> str | None:
        """The field's value; a field sent twice is refused (it would be ambiguous)."""
        values = self.fields.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise bad_request(f"{name}: sent {len(values)} times; send it once", name)
        return values[0]


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; 415 for any other type (a
    transcription is a file upload), 400 for one without a boundary."""
    if content_type is None:
        raise APIError(415, "Content-Type: missing; send multipart/form-data", None, "unsupported_media_type")
    media_type, options = parse_options_header(content_type)
    if media_type != b"multipart/form-data":
        got = media_type.decode("latin-1")[:64]
        raise APIError(415, f"Content-Type: expected multipart/form-data, got {got!r}", None, "unsupported_media_type")
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > 200:
        raise bad_request("Content-Type: multipart/form-data without a boundary")
    return boundary


class _FormReader:
    """Callbacks for python-multipart's ``MultipartParser``, collecting an ``Upload``."""

    def __init__(self, max_file_bytes: int):
        self.max_file_bytes = max_file_bytes
        self.upload = Upload()
        self.parts = 0
        self.ended = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._is_file = False
        self._data = bytearray()

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
            "on_end": self.end,
        }

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise bad_request(f"request body: more than {MAX_PARTS} form fields")
        self._headers, self._name, self._is_file, self._data = {}, None, False, bytearray()

    def header_end(self) -> None:
        self._headers[bytes(self._header_name).strip().lower()] = bytes(self._header_value).strip()
        self._header_name.clear()
        self._header_value.clear()

    def headers_finished(self) -> None:
        disposition, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name")
        if disposition != b"form-data" or name is None:
            raise bad_request('request body: a part without Content-Disposition: form-data; name="..."')
        self._name = name.decode("utf-8", "replace")[:64]
        self._is_file = b"filename" in options
        if self._is_file:
            if self.upload.file is not None:
                raise bad_request("request body: more than one file; send one file", self._name)
            self.upload.file_field = self._name
            self.upload.filename = options[b"filename"].decode("utf-8", "replace")[:256]
            content_type = self._headers.get(b"content-type")
            self.upload.content_type = content_type.decode("latin-1")[:128] if content_type else None

    def part_data(self, data: bytes, start: int, end: int) -> None:
        self._data += data[start:end]
        if self._is_file and len(self._data) > self.max_file_bytes:
            raise APIError(
                413,
                f"file: over the limit of {self.max_file_bytes} bytes ({_mb(self.max_file_bytes)})",
                "file",
                "file_too_large",
            )
        if not self._is_file and len(self._data) > MAX_FIELD_BYTES:
            raise bad_request(f"{self._name}: over the limit of {MAX_FIELD_BYTES} bytes for a form field", self._name)

    def part_end(self) -> None:
        if self._is_file:
            self.upload.file = bytes(self._data)
            return
        try:
            value = self._data.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request(f"{self._name}: not valid UTF-8", self._name) from None
        self.upload.fields.setdefault(self._name, []).append(value)

    def end(self) -> None:
        self.ended = True


def _mb(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


async def read_form(
    chunks: AsyncIterator[bytes], content_type: str | None, content_length: str | None, max_file_bytes: int
) -> Upload:
    """The form of a multipart body arriving as ``chunks``; ``APIError`` naming what is wrong:
    415 (not multipart), 413 (a declared length or a file over the limit, before reading on),
    400 (malformed, cut short, fields too long or too many)."""
    boundary = boundary_of(content_type)
    max_body = max_file_bytes + FORM_OVERHEAD_BYTES
    if content_length is not None:
        if not content_length.strip().isdigit():
            raise bad_request("Content-Length: not a number")
        if int(content_length) > max_body:
            raise APIError(
                413,
                f"request body: {int(content_length)} bytes is over the limit of {max_body} "
                f"(a file of at most {_mb(max_file_bytes)})",
                "file",
                "file_too_large",
            )
    reader = _FormReader(max_file_bytes)
    parser = MultipartParser(boundary, reader.callbacks())
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > max_body:
                raise APIError(413, f"request body: over the limit of {max_body} bytes", "file", "file_too_large")
            if not reader.ended:
                parser.write(chunk)
        parser.finalize()
    except MultipartParseError as e:
        raise bad_request(f"request body: not valid multipart/form-data ({str(e)[:120]})") from None
    if not reader.ended:
        raise bad_request("request body: the multipart body ended before its closing boundary (cut short?)")
    return reader.upload
