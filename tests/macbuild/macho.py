"""Reading Mach-O files and archives, writing .tbd link stubs.

Just what the macOS build check needs, with no tool beyond Python: the
symbols an object, archive or dylib defines and imports (with the library
each import is bound to), its load commands (libraries, rpaths, minimum
macOS), and text-based stubs (`.tbd`, the format of Apple's SDK) for
libraries that no wheel ships. Layouts are those of <mach-o/loader.h>,
<mach-o/nlist.h> and <ar.h> in Apple's SDK (zig ships them under
lib/libc/include/any-darwin-any).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

MH_MAGIC_64 = 0xFEEDFACF
FAT_MAGIC = 0xCAFEBABE
CPU_TYPE_ARM64 = 0x0100000C
FILETYPES = {1: "object", 2: "execute", 6: "dylib", 8: "bundle"}

LC_SYMTAB = 0x2
LC_LOAD_DYLIB = 0xC
LC_ID_DYLIB = 0xD
LC_LOAD_WEAK_DYLIB = 0x80000018
LC_REEXPORT_DYLIB = 0x8000001F
LC_LAZY_LOAD_DYLIB = 0x20
LC_LOAD_UPWARD_DYLIB = 0x80000023
LC_RPATH = 0x8000001C
LC_VERSION_MIN_MACOSX = 0x24
LC_BUILD_VERSION = 0x32
# Every command that adds a library to the two-level namespace's ordinals.
_DYLIB_COMMANDS = (LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_LAZY_LOAD_DYLIB, LC_LOAD_UPWARD_DYLIB)
PLATFORM_MACOS = 1

N_STAB, N_PEXT, N_TYPE, N_EXT = 0xE0, 0x10, 0x0E, 0x01
N_UNDF, N_SECT, N_INDR = 0x0, 0xE, 0xA
N_WEAK_REF = 0x40
# Library ordinals of an undefined symbol that name no library: resolved in
# the flat namespace when the image loads (what `-undefined dynamic_lookup`
# and ld64's `-U` leave behind).
SELF_LIBRARY_ORDINAL, DYNAMIC_LOOKUP_ORDINAL = 0x0, 0xFE


@dataclass(frozen=True)
class Symbol:
    name: str
    n_type: int
    n_desc: int
    n_value: int

    @property
    def external(self) -> bool:
        return bool(self.n_type & N_EXT) and not self.n_type & N_STAB

    @property
    def undefined(self) -> bool:
        # n_value != 0 on an undefined symbol is a common symbol: defined.
        return self.external and (self.n_type & N_TYPE) == N_UNDF and self.n_value == 0

    @property
    def defined(self) -> bool:
        return self.external and not self.undefined

    @property
    def ordinal(self) -> int:
        return (self.n_desc >> 8) & 0xFF


@dataclass
class Image:
    """One Mach-O image (an arm64 slice of a universal file is taken)."""

    path: str
    cputype: int
    filetype: str
    dylibs: list[str] = field(default_factory=list)  # in ordinal order (1-based)
    install_name: str | None = None
    rpaths: list[str] = field(default_factory=list)
    platform: int | None = None
    min_os: str | None = None
    symbols: list[Symbol] = field(default_factory=list)

    def imports(self) -> dict[str, str | None]:
        """Undefined external symbol -> the install name of the library it is
        bound to, or None where the flat namespace resolves it at load time."""
        out: dict[str, str | None] = {}
        for s in self.symbols:
            if not s.undefined:
                continue
            o = s.ordinal
            if o in (SELF_LIBRARY_ORDINAL, DYNAMIC_LOOKUP_ORDINAL) or o > len(self.dylibs):
                out[s.name] = None
            else:
                out[s.name] = self.dylibs[o - 1]
        return out

    def definitions(self) -> set[str]:
        return {s.name for s in self.symbols if s.defined}


def _version(v: int) -> str:
    major, minor, patch = v >> 16, (v >> 8) & 0xFF, v & 0xFF
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def _cstr(data: bytes, start: int) -> str:
    end = data.index(b"\0", start)
    return data[start:end].decode("utf-8", "replace")


def parse(data: bytes, path: str = "<memory>") -> Image:
    magic = struct.unpack_from(">I", data)[0]
    if magic == FAT_MAGIC:
        (n,) = struct.unpack_from(">I", data, 4)
        for i in range(n):
            cpu, _, off, size, _ = struct.unpack_from(">iiIII", data, 8 + 20 * i)
            if cpu == CPU_TYPE_ARM64:
                return parse(data[off : off + size], path)
        raise ValueError(f"{path}: a universal file without an arm64 slice")
    magic, cputype, _, filetype, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data)
    if magic != MH_MAGIC_64:
        raise ValueError(f"{path}: not a 64-bit Mach-O file (magic {magic:#x})")
    img = Image(path, cputype, FILETYPES.get(filetype, str(filetype)))
    off = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd in _DYLIB_COMMANDS or cmd == LC_ID_DYLIB:
            (name_off,) = struct.unpack_from("<I", data, off + 8)
            name = _cstr(data, off + name_off)
            if cmd == LC_ID_DYLIB:
                img.install_name = name
            else:
                img.dylibs.append(name)
        elif cmd == LC_RPATH:
            (path_off,) = struct.unpack_from("<I", data, off + 8)
            img.rpaths.append(_cstr(data, off + path_off))
        elif cmd == LC_BUILD_VERSION:
            img.platform, minos = struct.unpack_from("<II", data, off + 8)
            img.min_os = _version(minos)
        elif cmd == LC_VERSION_MIN_MACOSX:
            img.platform = PLATFORM_MACOS
            img.min_os = _version(struct.unpack_from("<I", data, off + 8)[0])
        elif cmd == LC_SYMTAB:
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, off + 8)
            for i in range(nsyms):
                strx, n_type, _, n_desc, n_value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if n_type & N_STAB:
                    continue
                img.symbols.append(Symbol(_cstr(data, stroff + strx), n_type, n_desc, n_value))
        off += size
    return img


def read(path: str | Path) -> Image:
    return parse(Path(path).read_bytes(), str(path))


def archive_members(path: str | Path) -> list[tuple[str, bytes]]:
    """The members of a static archive (BSD names `#1/<len>` or GNU `/<off>`
    long names), symbol tables left out."""
    data = Path(path).read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{path}: not an archive")
    off, longnames, out = 8, b"", []
    while off + 60 <= len(data):
        header = data[off : off + 60]
        name = header[:16].decode().rstrip()
        size = int(header[48:58].decode().strip())
        body = data[off + 60 : off + 60 + size]
        if name.startswith("#1/"):
            n = int(name[3:])
            name, body = body[:n].rstrip(b"\0").decode(), body[n:]
        elif name == "//":
            longnames, name = body, ""
        elif name.startswith("/") and name[1:].isdigit():
            start = int(name[1:])
            name = longnames[start : longnames.index(b"/\n", start)].decode()
        else:
            name = name.rstrip("/")
        if name and name not in ("/", "__.SYMDEF", "__.SYMDEF SORTED", "__.SYMDEF_64", "__.SYMDEF_64 SORTED"):
            out.append((name, body))
        off += 60 + size + (size & 1)
    return out


def archive_definitions(path: str | Path) -> set[str]:
    """Every external symbol the archive's Mach-O members define."""
    names: set[str] = set()
    for member, body in archive_members(path):
        if body[:4] in (struct.pack("<I", MH_MAGIC_64),):
            names |= parse(body, f"{path}({member})").definitions()
    return names


def _quote(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"


def write_tbd(path: str | Path, install_name: str, symbols: set[str] | list[str], target: str = "arm64-macos") -> None:
    """A text-based stub (TAPI v4, the SDK's format): a library at
    `install_name` exporting `symbols`, for the linker to bind imports to
    without the library itself."""
    names = sorted(set(symbols))
    body = ",\n                       ".join(_quote(n) for n in names)
    Path(path).write_text(
        "--- !tapi-tbd\n"
        "tbd-version:     4\n"
        f"targets:         [ {target} ]\n"
        f"install-name:    {_quote(install_name)}\n"
        "exports:\n"
        f"  - targets:         [ {target} ]\n"
        f"    symbols:         [ {body} ]\n"
        "...\n"
    )
