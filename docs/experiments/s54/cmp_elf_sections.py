#!/usr/bin/env python3
"""Compares two ELF files (cubins from `cuobjdump -xelf all`, or HIP code
objects) section by section, by name, ignoring where each section lies:
prints which sections differ. s54 used it to check that the fatbin
`cargo xtask kernels` leaves and the one crates/cuda/build.rs compiles hold
the same code (only `.note.nv.tkinfo`, ptxas's note of its own options,
differed), and the same for the HIP code objects (only the symbol tables,
through clang's per-compile `__hip_cuid_` symbol).

    python3 cmp_elf_sections.py A.cubin B.cubin
"""
import struct
import sys


def sections(path):
    data = open(path, "rb").read()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, _link, _info, _align, _entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        headers.append((name, kind, offset, size))
    names_at = headers[shstrndx][2]

    def name_of(offset):
        end = data.index(b"\0", names_at + offset)
        return data[names_at + offset:end].decode()

    found = {}
    for name, kind, offset, size in headers:
        body = b"" if kind == 8 else data[offset:offset + size]  # SHT_NOBITS holds no bytes
        found.setdefault(name_of(name), []).append(body)
    return found


def main():
    a, b = sections(sys.argv[1]), sections(sys.argv[2])
    print(f"sections: {len(a)} and {len(b)}; same names: {set(a) == set(b)}")
    for name in sorted(set(a) ^ set(b)):
        print(f"  only in one: {name}")
    differing = [n for n in a if n in b and a[n] != b[n]]
    print(f"differing: {len(differing)}")
    for name in differing:
        print(f"  {name}: {[len(x) for x in a[name]]} against {[len(x) for x in b[name]]} bytes")
    text = sum(len(x) for n in a if n.startswith(".text") for x in a[n])
    print(f".text bytes: {text}; .text sections differing: {sum(n.startswith('.text') for n in differing)}")
    return 1 if differing or set(a) != set(b) else 0


if __name__ == "__main__":
    sys.exit(main())
